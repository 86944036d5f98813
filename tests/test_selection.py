"""Selection rules against brute force over all C(n, m) subsets, plus validation and advantages."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pods_bench.errors import PodsBenchError
from pods_bench.selection import (
    SELECTION_RULES,
    _order_keys,
    choose,
    group_advantages,
    nonuniform_groups,
    select,
)

# The paper's GSM8K reward: correctness 0/1 plus up to 0.2 of format terms in steps of 0.025.
GSM8K_LEVELS = [c + f / 40 for c in (0.0, 1.0) for f in range(9)]
REWARD_VALUES = {
    "binary": st.sampled_from([0.0, 1.0]),
    "gsm8k": st.sampled_from(GSM8K_LEVELS),
    "float": st.floats(-1e3, 1e3, width=32),
}
settings.register_profile("selection", deadline=None, max_examples=60)
settings.load_profile("selection")


@st.composite
def reward_matrices(draw, values=REWARD_VALUES["gsm8k"], max_n=12, max_prompts=3):
    """(rewards (P, n) float32, m) with 1 <= m <= n <= max_n."""
    n = draw(st.integers(1, max_n))
    prompts = draw(st.integers(1, max_prompts))
    rows = draw(st.lists(st.lists(values, min_size=n, max_size=n), min_size=prompts, max_size=prompts))
    return torch.tensor(rows, dtype=torch.float32), draw(st.integers(1, n))


@cache
def all_subsets(n: int, m: int) -> np.ndarray:
    return np.array(list(itertools.combinations(range(n), m)), dtype=np.int64).reshape(-1, m)


def kept(rewards: torch.Tensor, indices: torch.Tensor) -> np.ndarray:
    return rewards.double().gather(1, indices).numpy()


def assert_valid_indices(indices: torch.Tensor, prompts: int, n: int, m: int):
    assert indices.shape == (prompts, m) and indices.dtype == torch.int64
    assert ((indices >= 0) & (indices < n)).all()
    assert (indices.sort(1).values.diff(1) > 0).all(), "indices must be unique per row"


# --- max_variance ---------------------------------------------------------------------------


@pytest.mark.parametrize("values", list(REWARD_VALUES))
@given(data=st.data())
def test_max_variance_matches_brute_force(values, data):
    rewards, m = data.draw(reward_matrices(REWARD_VALUES[values]))
    indices = select("max_variance", rewards, m)
    assert_valid_indices(indices, *rewards.shape, m)
    r = rewards.double().numpy()
    best = r[:, all_subsets(r.shape[1], m)].var(axis=2).max(axis=1)  # over all C(n, m) subsets
    got = kept(rewards, indices).var(axis=1)
    scale = (r.max(1) - r.min(1)) ** 2
    np.testing.assert_allclose(got, best, rtol=0, atol=1e-9 * scale.max() + 1e-12)


def stable_split_reference(row: list[float], m: int) -> list[int]:
    """The documented rule, spelled out: stable ascending sort, exact variances (fractions),
    smallest k (number of top rewards) among the best splits, indices in ascending reward order."""
    order = sorted(range(len(row)), key=lambda i: row[i])  # Python's sort is stable
    n, best = len(row), None
    for k in range(m + 1):
        subset = order[: m - k] + order[n - k :]
        values = [Fraction(row[i]) for i in subset]
        mean = sum(values) / m
        var = sum((v - mean) ** 2 for v in values)
        if best is None or var > best[0]:
            best = (var, subset)
    return best[1]


@pytest.mark.parametrize("values", ["binary", "gsm8k"])
@given(data=st.data())
def test_max_variance_tie_breaking_is_the_documented_one(values, data):
    rewards, m = data.draw(reward_matrices(REWARD_VALUES[values], max_n=20))
    expected = [stable_split_reference(row, m) for row in rewards.tolist()]
    assert select("max_variance", rewards, m).tolist() == expected


def test_max_variance_examples_and_edge_cases():
    r = torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]])
    assert select("max_variance", r, 4).tolist() == [[0, 3, 2, 5]]  # two 0s (lowest index) + two 1s
    assert select("max_variance", r, 1).tolist() == [[0]]  # m = 1: variance 0 anyway, lowest reward
    assert sorted(select("max_variance", r, 8)[0].tolist()) == list(range(8))  # m = n: everything
    # the optimum needs both ends, not the top m: {0, 10, 10} beats {10, 10, 9}
    assert sorted(select("max_variance", torch.tensor([[10.0, 9.0, 0.0, 10.0]]), 3)[0].tolist()) == [0, 2, 3]
    # float64, integer and boolean rewards are accepted; no prompts gives no rows
    assert select("max_variance", r.double(), 4).tolist() == [[0, 3, 2, 5]]
    assert select("max_variance", r.long(), 4).tolist() == [[0, 3, 2, 5]]
    assert select("max_variance", r.bool(), 4).tolist() == [[0, 3, 2, 5]]
    for rule in ("max_variance", "max_reward", "random", "max_abs_advantage"):
        assert select(rule, torch.zeros(0, 5), 2).shape == (0, 2)
    for dtype in (torch.float32, torch.float64):  # the input is never modified
        rewards = torch.tensor([[-0.0, -2.0, 3.0, 0.5]], dtype=dtype)
        select("max_variance", rewards, 2)
        assert rewards.tolist() == [[-0.0, -2.0, 3.0, 0.5]] and rewards[0, 0].signbit()


def test_max_variance_is_deterministic_and_precise_at_scale():
    g = torch.Generator().manual_seed(0)
    rewards = torch.tensor(GSM8K_LEVELS)[torch.randint(len(GSM8K_LEVELS), (256, 1024), generator=g)]
    first = select("max_variance", rewards, 16)
    assert torch.equal(first, select("max_variance", rewards.clone(), 16))
    # large offsets do not disturb the choice (shift invariance, float64 scoring)
    assert torch.equal(first, select("max_variance", rewards + 1000.0, 16))
    assert_valid_indices(first, 256, 1024, 16)


@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=40))
def test_order_keys_order_like_a_stable_sort(row):
    rewards = torch.tensor([row], dtype=torch.float32)
    keys = _order_keys(rewards)
    assert keys.unique().numel() == len(row)
    assert torch.equal(keys.argsort(1), torch.sort(rewards, dim=1, stable=True).indices)


# --- the other rules ------------------------------------------------------------------------


@pytest.mark.parametrize("rule", [r for r in SELECTION_RULES if r != "all"])
@given(data=st.data())
def test_every_rule_returns_unique_in_range_indices(rule, data):
    rewards, m = data.draw(reward_matrices(REWARD_VALUES["float"]))
    assert_valid_indices(select(rule, rewards, m, torch.Generator().manual_seed(0)), *rewards.shape, m)


@given(data=st.data())
def test_max_reward_keeps_the_m_highest(data):
    rewards, m = data.draw(reward_matrices(REWARD_VALUES["gsm8k"]))
    got = np.sort(kept(rewards, select("max_reward", rewards, m)), axis=1)
    expected = np.sort(rewards.double().numpy(), axis=1)[:, -m:]
    np.testing.assert_array_equal(got, expected)


@given(data=st.data())
def test_max_abs_advantage_matches_its_definition(data):
    rewards, m = data.draw(reward_matrices(REWARD_VALUES["float"]))
    r = rewards.double().numpy()
    distance = np.abs(r - r.mean(axis=1, keepdims=True))  # |r - mean over all n|
    best = distance[:, all_subsets(r.shape[1], m)].sum(axis=2).max(axis=1)  # brute force
    indices = select("max_abs_advantage", rewards, m).numpy()
    got = np.take_along_axis(distance, indices, axis=1).sum(axis=1)
    np.testing.assert_allclose(got, best, rtol=1e-9, atol=1e-9)


def test_all_keeps_every_rollout_and_requires_m_equal_n():
    rewards = torch.rand(3, 5)
    assert select("all", rewards, 5).tolist() == [list(range(5))] * 3
    with pytest.raises(PodsBenchError, match="m must equal n=5"):
        select("all", rewards, 4)


def test_random_is_reproducible_and_uniform():
    rewards = torch.zeros(20_000, 8)
    a = select("random", rewards, 3, torch.Generator().manual_seed(7))
    assert torch.equal(a, select("random", rewards, 3, torch.Generator().manual_seed(7)))
    assert not torch.equal(a, select("random", rewards, 3, torch.Generator().manual_seed(8)))
    assert_valid_indices(a, 20_000, 8, 3)
    counts = torch.bincount(a.flatten(), minlength=8).double()
    expected = 20_000 * 3 / 8  # each rollout is kept with probability m / n
    assert ((counts - expected).abs() < 0.05 * expected).all(), counts


# --- DAPO filter and advantages -------------------------------------------------------------


@given(data=st.data())
def test_nonuniform_groups_flags_prompts_with_any_reward_spread(data):
    rewards, m = data.draw(reward_matrices(REWARD_VALUES["binary"], max_prompts=6))
    mask = nonuniform_groups(rewards)
    assert mask.tolist() == [len(set(row)) > 1 for row in rewards.tolist()]
    kept_rewards = rewards[mask].gather(1, select("max_variance", rewards[mask], m))
    if m > 1:  # with the filter, max-variance never keeps an all-equal group
        assert (group_advantages(kept_rewards).abs().amax(1) > 0).all()


@given(data=st.data(), scale_by_std=st.booleans())
def test_group_advantages(data, scale_by_std):
    rewards, _ = data.draw(reward_matrices(REWARD_VALUES["gsm8k"], max_prompts=4))
    adv = group_advantages(rewards, scale_by_std=scale_by_std)
    assert adv.shape == rewards.shape and torch.isfinite(adv).all()
    uniform = rewards.amax(1) == rewards.amin(1)
    assert (adv[uniform] == 0).all()  # all-equal groups (and m = 1) get exactly 0
    spread = ~uniform
    if not spread.any():
        return
    r = rewards[spread].double()
    centred = r - r.mean(1, keepdim=True)
    expected = centred / (r.std(1, keepdim=True) + 1e-4) if scale_by_std else centred  # unbiased std
    torch.testing.assert_close(adv[spread].double(), expected, rtol=1e-5, atol=1e-5)
    assert adv[spread].mean(1).abs().max() < 1e-5
    if scale_by_std:  # std of the advantages = std / (std + eps): unit up to eps / std
        assert ((adv[spread].double().std(1) - 1).abs() < 1e-2).all()


def test_group_advantages_edge_cases():
    assert group_advantages(torch.tensor([[0.7], [0.0]])).tolist() == [[0.0], [0.0]]  # m = 1
    equal = torch.full((1, 3), 0.4900934100151062)  # float32 mean of these three is not exactly 0.49009...
    assert equal.mean() != equal[0, 0] and group_advantages(equal).tolist() == [[0.0] * 3]
    assert group_advantages(torch.tensor([[0.0, 1.0]]))[0].tolist() == pytest.approx([-0.7070, 0.7070], abs=1e-4)
    with pytest.raises(PodsBenchError, match="at least one rollout"):
        group_advantages(torch.zeros(2, 0))


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule, rewards, m, message",
    [
        ("max_varience", torch.zeros(2, 4), 2, "unknown selection rule 'max_varience'"),
        ("max_variance", torch.zeros(2, 4), 5, "m .* must be an integer in 1..n=4, got 5"),
        ("max_variance", torch.zeros(2, 4), 0, "in 1..n=4, got 0"),
        ("max_variance", torch.zeros(2, 4), 2.0, "got 2.0"),
        ("max_variance", torch.zeros(2, 1), 2, "in 1..n=1, got 2"),  # n < 2 with a variance rule
        ("random", torch.zeros(2, 0), 1, "in 1..n=0"),
        ("max_variance", torch.zeros(8), 2, r"must be 2-D \(prompts, rollouts\), got shape \(8,\)"),
        ("max_reward", torch.zeros(2, 2, 2), 2, "got shape"),
        ("max_variance", torch.tensor([[0.0, float("nan")]]), 1, "NaN or infinite"),
        ("max_abs_advantage", torch.tensor([[0.0, float("-inf")]]), 1, "NaN or infinite"),
        ("max_variance", [[0.0, 1.0]], 1, "must be a torch.Tensor, got list"),
    ],
)
def test_bad_input_is_one_line_pods_bench_error(rule, rewards, m, message):
    with pytest.raises(PodsBenchError, match=message) as error:
        select(rule, rewards, m)
    assert "\n" not in str(error.value)


def test_filter_and_advantages_validate_too():
    with pytest.raises(PodsBenchError, match="NaN"):
        nonuniform_groups(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(PodsBenchError, match="kept rewards must be 2-D"):
        group_advantages(torch.zeros(4))


# --- groups of different sizes (VIGOR, HORA) ---------------------------------------------------------


def _selection(**settings):
    from pods_bench.config import config_from_dict

    return config_from_dict({"selection": settings, "budget": {"max_steps": 1}}).selection


def test_groups_of_different_sizes_keep_m_or_all_and_their_advantages_are_per_group():
    from pods_bench.selection import choose

    rewards = [torch.tensor(r, dtype=torch.float64) for r in ([1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [1.0] * 4, [1.0])]
    # PODS 4/2: a group of 2 keeps both, one of 4 its best 1 and 0, the all-equal group two zeros, the
    # group of one its single rollout (smaller than m); unbiased std over the kept 2: 0.7071
    c = choose(rewards, _selection(rule="max_variance", n=4, m=2))
    assert c.groups == [0, 1, 2, 3]
    assert c.rows.tolist() == [0, 0, 1, 1, 2, 2, 3]
    assert c.cols.tolist()[:2] == [1, 0] and c.rewards.tolist() == [0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    a = 0.5 / (0.5**0.5 + 1e-4)
    assert c.advantages.tolist() == pytest.approx([-a, a, -a, a, 0, 0, 0])
    assert c.informative.tolist() == [True, True, False, False]
    # GRPO ("all"): every rollout of every group, whatever its size
    c = choose(rewards, _selection(rule="all", n=4, m=4))
    assert c.rows.tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    b = 0.5 / ((1 / 3) ** 0.5 + 1e-4)  # rewards 0, 1, 1, 0: mean 0.5, unbiased std 0.577
    assert c.advantages.tolist() == pytest.approx([a, -a, -b, b, b, -b, 0, 0, 0, 0, 0])
    # DAPO's filter drops the all-equal groups of any size
    c = choose(rewards, _selection(rule="all", n=4, m=4, filter_uniform_groups=True))
    assert c.groups == [0, 1] and c.rows.tolist() == [0, 0, 1, 1, 1, 1]
    # a filtered group before the kept ones: each kept rollout is its own group's (its reward at its column)
    ragged = [torch.tensor(r, dtype=torch.float64) for r in ([1.0] * 4, [0.0, 1.0, 1.0, 0.0], [1.0, 0.0])]
    c = choose(ragged, _selection(rule="all", n=4, m=4, filter_uniform_groups=True))
    assert c.groups == [1, 2] and c.rows.tolist() == [0, 0, 0, 0, 1, 1]
    assert c.rewards.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert [ragged[c.groups[r]][col].item() for r, col in zip(c.rows.tolist(), c.cols.tolist())] == c.rewards.tolist()


def test_groups_of_one_size_as_a_list_choose_exactly_as_the_matrix():
    from pods_bench.selection import choose

    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.5], [0.0, 0.0, 1.0, 0.2]], dtype=torch.float64)
    for s in (_selection(rule="max_variance", n=4, m=2), _selection(rule="random", n=4, m=3)):
        a = choose(rewards, s, torch.Generator().manual_seed(0))
        b = choose(list(rewards), s, torch.Generator().manual_seed(0))
        assert a.groups == b.groups and torch.equal(a.rows, b.rows) and torch.equal(a.cols, b.cols)
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.rewards, b.rewards)


def test_batch_level_pruning_of_groups_of_different_sizes_is_one_line():
    from pods_bench.selection import choose

    s = _selection(rule="max_abs_advantage", n=4, m=2, advantage_over="all", scope="batch")
    with pytest.raises(PodsBenchError) as error:
        choose([torch.zeros(4, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)], s)
    assert str(error.value) == (
        "selection.scope: 'batch' (CPPO's batch-level pruning keeps groups x m rollouts) needs groups of one "
        "size; this step's groups have 2-4 rollouts"
    )


def test_choose_samples_the_random_rule_from_the_generator_it_is_given():
    """Steps 4-5 hand their generator to the rule, on the uniform path and on the ragged one (groups
    of different sizes): the same seed keeps the same rollouts whatever torch's global RNG did in
    between, another seed keeps others."""
    from pods_bench.selection import choose

    s = _selection(rule="random", n=8, m=2)
    uniform = torch.rand(6, 8, generator=torch.Generator().manual_seed(0))
    ragged = [torch.rand(k, generator=torch.Generator().manual_seed(k)) for k in (8, 6, 8, 6, 8, 6)]
    for rewards in (uniform, ragged):
        kept = []
        for seed in (5, 5, 6):
            torch.manual_seed(len(kept))  # the global RNG moves between the calls
            kept.append(choose(rewards, s, torch.Generator().manual_seed(seed)).cols)
        assert torch.equal(kept[0], kept[1]) and not torch.equal(kept[0], kept[2])


def test_negative_rewards_order_like_floats():
    """The sort keys flip the magnitude bits of negative rewards (pods_bench/selection.py
    `_order_keys`): max_reward then picks what a stable descending sort of the floats picks, for
    rewards of both signs (-0.0 ties with +0.0, the earlier rollout first)."""
    rewards = torch.tensor([[-0.5, -2.0, 0.3, -1.0, -0.0, 0.0, -3.5, 0.3]])
    # descending: 0.3 (2), 0.3 (7), then the zeros (4, 5), -0.5 (0), -1.0 (3), -2.0 (1), -3.5 (6)
    assert select("max_reward", rewards, 6).tolist() == [[2, 7, 4, 5, 0, 3]]
    g = torch.Generator().manual_seed(3)
    mixed = torch.randn(5, 16, generator=g)
    expected = torch.sort(mixed, dim=1, descending=True, stable=True).indices[:, :4]
    assert torch.equal(select("max_reward", mixed, 4), expected)


def test_select_takes_m_up_to_n_and_refuses_more_by_outcome():
    """select's 1 <= m <= n at both ends, as outcomes: m = n keeps every rollout (under every rule that
    allows it), m = n + 1 and m = 0 are the one-line refusal."""
    rewards = torch.tensor([[0.0, 1.0, 0.5, 0.25]])  # n = 4; the best single rollout is index 1

    def outcome(rule: str, m: int):
        try:
            return sorted(select(rule, rewards, m).flatten().tolist())
        except PodsBenchError as e:
            return str(e)

    assert [outcome(rule, 4) for rule in ("all", "max_reward", "max_variance")] == [[0, 1, 2, 3]] * 3
    assert outcome("max_reward", 1) == [1]
    assert outcome("max_reward", 5) == "m (rollouts kept per prompt) must be an integer in 1..n=4, got 5"
    assert outcome("max_reward", 0) == "m (rollouts kept per prompt) must be an integer in 1..n=4, got 0"


# --- a rule registered with settings of its own ---------------------------------------------------


@dataclass
class SkipSettings:
    skip: int = 1  # lowest rewards passed over before the draw


def skip_then_draw(rewards, m, generator=None, settings=None):
    """m rollouts drawn with `generator` from those above the `settings.skip` lowest (stable order).
    Without settings it skips none: a fallback unlike its dataclass's default, so that a test sees
    which of the two arrived."""
    skip = settings.skip if settings is not None else 0
    above = torch.sort(rewards, dim=1, stable=True).indices[:, skip:]
    draw = torch.rand(above.shape, generator=generator).argsort(1)[:, :m]
    return above.gather(1, draw)


@pytest.fixture
def toy_rule_with_settings():
    SELECTION_RULES.register("skip_then_draw", settings=SkipSettings)(skip_then_draw)
    yield
    SELECTION_RULES.unregister("skip_then_draw")


def test_select_hands_a_rule_with_settings_its_rewards_m_generator_and_settings(toy_rule_with_settings):
    """`select` calls a rule registered with settings with all four arguments: the settings given, or
    the dataclass's defaults (skip 1) when none are; and the generator given, not torch's global one."""
    rewards = torch.tensor([[7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]] * 3)  # ascending order: 7, 6, ..., 0
    seeded = lambda: torch.Generator().manual_seed(11)
    direct = {skip: skip_then_draw(rewards, 3, seeded(), SkipSettings(skip)) for skip in (0, 1, 2)}
    # the three skips keep different rollouts (skip k never keeps index 8 - k .. 7), so the test tells them apart
    assert all(not torch.equal(direct[a], direct[b]) for a, b in ((0, 1), (1, 2), (0, 2)))
    for k in (1, 2):
        assert not (direct[k] >= 8 - k).any()
    torch.manual_seed(0)  # torch's global RNG: another stream than the seeded generator
    assert torch.equal(select("skip_then_draw", rewards, 3, seeded(), SkipSettings(2)), direct[2])
    assert torch.equal(select("skip_then_draw", rewards, 3, seeded()), direct[1])  # the dataclass's default
    torch.manual_seed(0)
    global_draw = skip_then_draw(rewards, 3, None, SkipSettings(2))
    assert not torch.equal(global_draw, direct[2])  # the global RNG would keep other rollouts


def test_choose_hands_the_rule_its_config_section(toy_rule_with_settings):
    """Steps 4-5 pass the rule's section selection.<rule> of the config (skip 2, not the default 1)."""
    s = _selection(rule="skip_then_draw", n=8, m=3, skip_then_draw={"skip": 2})
    rewards = torch.tensor([[7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]])
    c = choose(rewards, s, torch.Generator().manual_seed(4))
    expected = skip_then_draw(rewards, 3, torch.Generator().manual_seed(4), SkipSettings(2))
    assert c.cols.tolist() == expected.flatten().tolist()
    assert not torch.equal(expected, skip_then_draw(rewards, 3, torch.Generator().manual_seed(4), SkipSettings(1)))


# --- what the checks let through, exactly -------------------------------------------------------


def test_messages_name_the_rewards_and_the_rules():
    with pytest.raises(PodsBenchError, match=r"^rewards must be 2-D \(prompts, rollouts\), got shape \(8,\)$"):
        select("max_variance", torch.zeros(8), 2)
    with pytest.raises(PodsBenchError, match=r"^rewards contain NaN or infinite values$"):
        select("max_variance", torch.tensor([[0.0, float("nan")]]), 1)
    with pytest.raises(PodsBenchError, match=r"^rewards must be real, got dtype torch.complex64$"):
        select("max_variance", torch.zeros(2, 2, dtype=torch.complex64), 1)
    with pytest.raises(PodsBenchError, match=r"^kept rewards must have at least one rollout per prompt$"):
        group_advantages(torch.zeros(2, 0))
    with pytest.raises(PodsBenchError) as error:
        select("max_varience", torch.zeros(2, 4), 2)
    assert str(error.value) == (
        "unknown selection rule 'max_varience'; choose from max_variance, max_reward, random, all, max_abs_advantage"
    )


def test_float64_rewards_are_compared_as_float64_and_integers_become_float():
    # 1 + 2^-40 rounds to 1.0 in float32: kept as float64 it is the higher reward
    assert select("max_reward", torch.tensor([[1.0, 1.0 + 2**-40]], dtype=torch.float64), 1).tolist() == [[1]]
    # integer rewards: advantages in the default float dtype, 0 and 1 -> -/+ 0.5 / (0.7071 + 1e-4)
    adv = group_advantages(torch.tensor([[0, 1]]))
    assert adv.dtype == torch.get_default_dtype()
    assert adv[0].tolist() == pytest.approx([-0.5 / (0.5**0.5 + 1e-4), 0.5 / (0.5**0.5 + 1e-4)])


def test_order_keys_flip_the_lowest_float32_mantissa_bit_of_negative_rewards():
    """Bit 29 of the widened float64 is the lowest float32 mantissa bit: -1 - 2^-23 (bit set) is
    below -1.0 (bit clear), so its key must be the smaller one, which takes flipping bit 29 too."""
    below = -1.0 - 2**-23  # the float32 just below -1.0
    rewards = torch.tensor([[-1.0, below, 1.0 + 2**-23, 1.0]])
    assert _order_keys(rewards).argsort(1).tolist() == [[1, 0, 3, 2]]
    # max_variance with m = 1 keeps the lowest reward
    assert select("max_variance", torch.tensor([[-1.0, below]]), 1).tolist() == [[1]]


def test_only_rows_whose_rewards_are_all_equal_get_zero_advantages():
    # a uniform row whose float32 mean is not exactly its value, beside a row with a larger maximum:
    # the all-equal test is per row (a batch-wide maximum would leave the rounding residue / eps)
    x = 0.4900934100151062
    adv = group_advantages(torch.tensor([[x, x, x], [0.0, 1.0, 0.5]]))
    assert adv[0].tolist() == [0.0, 0.0, 0.0]
    assert adv[1].tolist() == pytest.approx([-0.5 / (0.5 + 1e-4), 0.5 / (0.5 + 1e-4), 0.0])  # unbiased std 0.5


# --- choose: the corners of steps 4-5 ---------------------------------------------------------


def test_choose_with_no_group_left_is_empty_and_typed():
    """No groups at all, or every group all-equal under DAPO's filter (one size or several): nothing
    trains, and the empty tensors keep their dtypes (indices long, advantages and rewards float64)."""
    filtered = _selection(rule="max_variance", n=4, m=2, filter_uniform_groups=True)
    cases = [
        (choose([], _selection(rule="max_variance", n=4, m=2)), []),
        (choose(torch.ones(2, 4, dtype=torch.float64), filtered), [False, False]),
        (choose([torch.ones(4, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)], filtered), [False, False]),
    ]
    for c, informative in cases:
        assert c.groups == [] and c.informative.tolist() == informative
        for t, dtype in ((c.rows, torch.long), (c.cols, torch.long), (c.advantages, torch.float64), (c.rewards, torch.float64)):  # fmt: skip
            assert t.shape == (0,) and t.dtype == dtype


def test_ragged_choice_keeps_float64_rewards_and_advantages():
    # 0.1 and 0.7 are not float32 numbers: the kept rewards come back exactly
    ragged = [torch.tensor([0.1, 0.7], dtype=torch.float64), torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float64)]
    c = choose(ragged, _selection(rule="max_reward", n=4, m=2, scale_advantage_by_std=False))
    assert c.rows.dtype == torch.long and c.cols.dtype == torch.long
    assert c.rewards.tolist() == [0.7, 0.1, 0.7, 0.1]  # max_reward: descending, ties by index
    # Dr. GRPO (no std): r - mean of the kept two, +-0.3 to float64 precision (float32 would be ~1e-8 off)
    assert c.advantages.dtype == torch.float64
    assert c.advantages.tolist() == pytest.approx([0.3, -0.3, 0.3, -0.3], rel=0, abs=1e-15)


def test_under_rule_all_a_group_larger_than_n_keeps_every_rollout():
    # HORA's groups are n on average: a group of 6 with n = m = 4 trains all 6 under GRPO
    ragged = [torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([1.0, 0.0])]
    c = choose(ragged, _selection(rule="all", n=4, m=4))
    assert c.rows.tolist() == [0] * 6 + [1] * 2 and c.cols.tolist() == [0, 1, 2, 3, 4, 5, 0, 1]


def test_groups_of_one_size_as_a_list_go_batch_level_too():
    # one size: the (groups, n) path, so CPPO's batch-level pruning works on a list as on the matrix
    s = _selection(rule="max_abs_advantage", n=4, m=2, advantage_over="all", scope="batch")
    rewards = torch.tensor([[0.0, 1.0, 1.0, 0.5], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    a, b = choose(rewards, s), choose(list(rewards), s)
    assert a.rows.tolist() == b.rows.tolist() and a.cols.tolist() == b.cols.tolist()


def test_cppo_advantages_over_all_n_are_kept_as_they_are():
    """advantage_over: all (CPPO): the advantages are normalised over the group's n rewards and the
    kept rollouts keep theirs. Rewards 0, 0, 0, 1: mean 0.25, unbiased std 0.5; the two farthest
    from the mean are rollout 3 (+0.75) and rollout 0 (-0.25, the first of three ties)."""
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    c = choose(rewards, _selection(rule="max_abs_advantage", n=4, m=2, advantage_over="all"))
    assert c.rows.tolist() == [0, 0, 1, 1] and c.cols.tolist() == [3, 0, 0, 1]
    # over the kept two (0 and 1) they would be -/+0.7070 instead
    assert c.advantages.tolist() == pytest.approx([0.75 / (0.5 + 1e-4), -0.25 / (0.5 + 1e-4), 0.0, 0.0], abs=1e-12)
    c = choose(
        rewards, _selection(rule="max_abs_advantage", n=4, m=2, advantage_over="all", scale_advantage_by_std=False)
    )
    assert c.advantages.tolist() == [0.75, -0.25, 0.0, 0.0]


def test_cppo_batch_level_pruning_keeps_the_largest_advantages_of_the_batch_in_batch_order():
    """scope: batch keeps groups x m = 4 rollouts over the whole batch. Group 0 (0, 1, 1, 0.5): mean
    0.625, deviations -0.625, 0.375, 0.375, -0.125, unbiased std sqrt(0.6875 / 3); group 1 (0, 0, 0, 1):
    -0.25 x 3 and 0.75 over std 0.5. By |A|: (1, 3) 1.4997, (0, 0) 1.3053, (0, 1) and (0, 2) 0.7832,
    then the three 0.4999s; in batch order: group 0's three first."""
    rewards = torch.tensor([[0.0, 1.0, 1.0, 0.5], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    c = choose(rewards, _selection(rule="max_abs_advantage", n=4, m=2, advantage_over="all", scope="batch"))
    assert c.rows.tolist() == [0, 0, 0, 1] and c.cols.tolist() == [0, 1, 2, 3]
    std0 = (0.6875 / 3) ** 0.5
    expected = [-0.625 / (std0 + 1e-4), 0.375 / (std0 + 1e-4), 0.375 / (std0 + 1e-4), 0.75 / (0.5 + 1e-4)]
    assert c.advantages.tolist() == pytest.approx(expected, abs=1e-12)
    assert c.rewards.tolist() == [0.0, 1.0, 1.0, 1.0]
    # one group, m = 2: rollout 3, then the first of the three tied 0.4999s (a stable sort)
    c = choose(rewards[1:], _selection(rule="max_abs_advantage", n=4, m=2, advantage_over="all", scope="batch"))
    assert c.cols.tolist() == [0, 3]
