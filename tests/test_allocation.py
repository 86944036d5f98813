"""The allocation strategies' rules on small hand-worked cases: refill rounds and surplus (DAPO),
skip probabilities, streaks and the adaptation of p (GRESO), buffer, commit, eviction and age limit
(Pilot-Commit), CPPO's batch-level pruning, and the one-line errors of bad settings.

Here the rollouts' outcomes are scripted per prompt (a prompt with pass rate q gets round(q k) of its k
rollouts right), so every decision can be worked out by hand; everything else (the seeded prompt
stream, the data cursor, the strategies' random draws) is the trainer's own. Real training with every
strategy, and exact resumes of their state, are in tests/test_allocation_training.py.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from pods_bench.allocation import ALLOCATION_STRATEGIES, make_allocator
from pods_bench.allocation.base import StepShape
from pods_bench.allocation.vigor import VigorConfig
from pods_bench.config import config_from_dict, validate
from pods_bench.errors import PodsBenchError
from pods_bench.sampling import Graded, Groups, PromptStream, RolloutSampler
from pods_bench.train import keep_rollouts
from pods_bench.update import KeptRollout

NUM_PROMPTS = 12


class ScriptedSampler(RolloutSampler):
    """The trainer's sampler with scripted outcomes: prompt i's k rollouts are round(rate[i] k) right
    (reward 1) and the rest wrong (reward 0). Records what it was asked to sample."""

    def __init__(self, cfg, rates: dict[int, float], step: int = 0, cursor: int = 0):
        stream = PromptStream(NUM_PROMPTS, cfg.seed)
        super().__init__(
            stream,
            seed=cfg.seed,
            sampling=cfg.sampling,
            grading=cfg.reward.grading,
            step=step,
            cursor=cursor,
            prompts=["?"] * NUM_PROMPTS,
        )
        self.rates, self.calls_made = rates, []

    def sample(self, prompts, k, owners=None, repeats=1):
        self.calls_made.append((list(prompts), k))
        correct = np.array(
            [[1.0] * round(self.rates[p] * k) + [0.0] * (k - round(self.rates[p] * k)) for p in prompts]
        )
        correct = correct.reshape(len(prompts), k)
        local = Groups(
            list(prompts),
            [[p] for p in prompts],
            [[[p, self.step, j] for j in range(k)] for p in prompts],
            correct.copy(),
            correct,
            np.zeros_like(correct),
            [self.step] * len(prompts),
        )
        everyone = [Graded(p, 0, row, tuple(correct[row]), tuple(correct[row])) for row, p in enumerate(prompts)]
        self.counts["rollouts_generated"] += correct.size
        return local, everyone


def make_cfg(strategy: str, n: int = 8, m: int = 8, P: int = 2, **settings):
    cfg = config_from_dict(
        {
            "prompts_per_step": P,
            "selection": {"rule": "all" if m == n else "max_variance", "n": n, "m": m},
            "allocation": {"strategy": strategy, strategy: settings} if settings else {"strategy": strategy},
            "budget": {"max_steps": 10},
        }
    )
    validate(cfg)
    return cfg


def stream_order(seed: int = 0) -> list[int]:
    return PromptStream(NUM_PROMPTS, seed).take(0, NUM_PROMPTS)


# --- DAPO dynamic sampling ---------------------------------------------------------------------------


def test_dynamic_sampling_refills_until_the_batch_is_full_and_drops_the_surplus():
    order = stream_order()
    # round 1 (3 prompts): one mixed group; round 2: two mixed groups, of which one is surplus
    rates = dict.fromkeys(range(NUM_PROMPTS), 1.0)
    rates |= {order[1]: 0.5, order[2]: 0.0, order[3]: 0.25, order[4]: 0.0, order[5]: 0.75}
    cfg = make_cfg("dynamic_sampling", P=2, prompts_per_round=3)
    sampler = ScriptedSampler(cfg, rates)
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(sampler)

    assert batch.prompt == [order[1], order[3]]  # the earliest mixed groups; order[5] is surplus
    assert batch.sizes == [8, 8]
    assert stats == {
        "num_gen_batches": 2,
        "groups_sampled": 6,
        "groups_discarded_zero_std": 3,  # order[0] (all right), order[2] and order[4] (all wrong)
        "groups_discarded_surplus": 1,  # order[5]
    }
    assert [c[0] for c in sampler.calls_made] == [order[0:3], order[3:6]]
    assert sampler.cursor == 6  # every drawn prompt is consumed, surplus included


def test_dynamic_sampling_stops_with_one_line_or_trains_short_after_max_rounds():
    rates = dict.fromkeys(range(NUM_PROMPTS), 0.0) | {stream_order()[0]: 0.5}
    cfg = make_cfg("dynamic_sampling", P=2, prompts_per_round=2, max_rounds=2)
    with pytest.raises(PodsBenchError) as error:
        make_allocator(cfg, NUM_PROMPTS).collect(ScriptedSampler(cfg, rates))
    assert str(error.value) == (
        "allocation.dynamic_sampling: 1 of the 2 groups a step trains on after 2 rounds (every other group was "
        "all correct or all wrong); raise allocation.dynamic_sampling.max_rounds (0: no limit) or set "
        "allocation.dynamic_sampling.when_short=train"
    )
    cfg = make_cfg("dynamic_sampling", P=2, prompts_per_round=2, max_rounds=2, metric="reward")
    with pytest.raises(PodsBenchError) as error:
        make_allocator(cfg, NUM_PROMPTS).collect(ScriptedSampler(cfg, rates))
    assert "after 2 rounds (every other group's rewards were all equal); raise" in str(error.value)
    cfg = make_cfg("dynamic_sampling", P=2, prompts_per_round=2, max_rounds=2, when_short="train")
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(ScriptedSampler(cfg, rates))
    assert len(batch) == 1 and stats["num_gen_batches"] == 2

    # no round limit: one pass over the data at most (GRESO's rounds end the same way, and say so)
    for strategy, why in [
        ("dynamic_sampling", "every other group was all correct or all wrong"),
        ("greso", "every other group's rewards were all equal"),
    ]:
        cfg = make_cfg(strategy, P=2, prompts_per_round=5, max_rounds=0)
        with pytest.raises(PodsBenchError) as error:
            make_allocator(cfg, NUM_PROMPTS).collect(ScriptedSampler(cfg, rates))
        assert str(error.value) == (
            f"allocation.{strategy}: 1 of the 2 groups a step trains on after drawing every one of the 12 "
            f"training prompts ({why})"
        )
    # a round that ends exactly at the last prompt has drawn one whole pass, not more: one more round
    cfg = make_cfg("dynamic_sampling", P=2, prompts_per_round=4, max_rounds=0)
    sampler = ScriptedSampler(cfg, rates)
    with pytest.raises(PodsBenchError, match="after drawing every one of the 12 training prompts"):
        make_allocator(cfg, NUM_PROMPTS).collect(sampler)
    assert [len(prompts) for prompts, _ in sampler.calls_made] == [4, 4, 4, 4]


def test_dynamic_sampling_metric_correct_drops_all_wrong_groups_that_differ_only_in_format():
    graded = Graded(0, 0, 0, rewards=(0.0, 0.1, 0.2), correct=(0.0, 0.0, 0.0))
    assert graded.differs("reward") and not graded.differs("correct")
    assert Graded(0, 0, 0, (1.0, 0.1), (1.0, 0.0)).differs("correct")

    class FormatBonus(ScriptedSampler):
        """Scripted correctness, and a format bonus on every other rollout: rewards vary in every group."""

        def sample(self, prompts, k, owners=None, repeats=1):
            local, everyone = super().sample(prompts, k, owners, repeats)
            bonus = [0.1 * (j % 2) for j in range(k)]
            return local, [
                Graded(g.prompt, g.owner, g.row, tuple(r + b for r, b in zip(g.rewards, bonus)), g.correct)
                for g in everyone
            ]

    all_wrong = dict.fromkeys(range(NUM_PROMPTS), 0.0)
    cfg = make_cfg("dynamic_sampling", P=2, prompts_per_round=2, max_rounds=2, metric="reward")
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(FormatBonus(cfg, all_wrong))
    assert len(batch) == 2 and (stats["num_gen_batches"], stats["groups_discarded_zero_std"]) == (1, 0)
    cfg = make_cfg("dynamic_sampling", P=2, prompts_per_round=2, max_rounds=2, when_short="train")  # "correct"
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(FormatBonus(cfg, all_wrong))
    assert len(batch) == 0 and (stats["num_gen_batches"], stats["groups_discarded_zero_std"]) == (2, 4)


# --- GRESO -------------------------------------------------------------------------------------------


def test_greso_keep_probability_is_p_to_the_streak_with_a_floor():
    cfg = make_cfg("greso", p_easy=0.5, p_hard=0.8, skip_floor=0.01)
    g = make_allocator(cfg, NUM_PROMPTS)
    g.easy_streak[:4] = [0, 1, 3, 10]
    g.hard_streak[4:7] = [1, 2, 30]
    assert [g.keep_probability(i) for i in range(7)] == pytest.approx([1, 0.5, 0.125, 0.01, 0.8, 0.64, 0.01])


def test_greso_records_streaks_from_every_group_and_skips_at_the_rate_it_says():
    cfg = make_cfg("greso", P=2, prompts_per_round=3)
    g = make_allocator(cfg, NUM_PROMPTS)
    everyone = [Graded(0, 0, 0, (1, 1), (1, 1)), Graded(1, 0, 1, (0, 0), (0, 0)), Graded(2, 0, 2, (1, 0), (1, 0))]
    g._step_counts = {"easy": 0, "hard": 0, "groups": 0}
    for _ in range(2):
        g.observe(None, everyone)
    assert (g.easy_streak[:3].tolist(), g.hard_streak[:3].tolist()) == ([2, 0, 0], [0, 2, 0])
    g.observe(None, [Graded(0, 0, 0, (1, 0), (1, 0))])  # a mixed group ends the streak
    assert g.easy_streak[0] == 0

    # keep probability 0.25 for every prompt: over many draws about a quarter are rolled out
    g.easy_streak[:] = 2
    sampler = ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.5))
    kept, g._skipped = [], 0
    for r in range(200):
        kept += g.candidates(sampler, 3, r)[0]
    drawn = sampler.cursor  # the data cursor: every drawn prompt, kept or skipped, moved it on
    assert 0.2 < len(kept) / drawn < 0.3 and g._skipped == drawn - len(kept)
    # worked by hand: walk the seeded stream, one uniform draw of the round's generator per prompt
    expected, cursor = [], 0
    for r in range(200):
        rng, stream, picked = np.random.default_rng([cfg.seed, 0, r]), PromptStream(NUM_PROMPTS, cfg.seed), []
        for _ in range(NUM_PROMPTS):  # at most one pass over the prompts per round
            if len(picked) == 3:
                break
            prompt = stream.take(cursor, 1)[0]
            cursor += 1
            if rng.random() < 0.25:
                picked.append(prompt)
        expected += picked
    assert (kept, drawn) == (expected, cursor)


def test_greso_draws_a_number_only_for_a_prompt_it_may_skip_and_keeps_it_when_the_draw_is_below_p():
    """A prompt off any streak (keep probability 1) is kept without a draw, so the next prompt that may
    be skipped gets the round's next number; a draw equal to p skips (U < p has probability p)."""
    cfg = make_cfg("greso", P=2, p_easy=0.5)
    g = make_allocator(cfg, NUM_PROMPTS)
    order = stream_order()
    g.easy_streak[order[1::2]] = 2  # every second prompt drawn: keep probability 0.25; the rest 1
    sampler, g._skipped = ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.5)), 0
    kept, drawn = g.candidates(sampler, 8, 0)
    rng, expected = np.random.default_rng([cfg.seed, 0, 0]), []  # the round's generator, by hand
    for prompt in order:
        if len(expected) == 8:
            break
        if g.easy_streak[prompt] == 0 or rng.random() < 0.25:
            expected.append(prompt)
    assert (kept, drawn) == (expected, order.index(expected[-1]) + 1)
    assert kept[:3] == [order[0], order[2], order[4]] and len(set(kept) & set(order[1::2])) == 2

    class Draws:  # a round generator whose every uniform draw is `value`
        def __init__(self, value):
            self.value = value

        def random(self):
            return self.value

    g.easy_streak[:] = 1  # keep probability 0.5 everywhere
    for value, expected_kept in [(0.5, []), (0.4999, order[:2])]:
        sampler = ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.5))
        sampler.rng = lambda *tag, value=value: Draws(value)
        assert g.candidates(sampler, 2, 0)[0] == expected_kept


def test_greso_adapts_p_towards_the_target_share_from_the_second_epoch_on():
    cfg = make_cfg("greso", P=2, prompts_per_round=4, p_easy=0.5, p_hard=0.5)
    order = stream_order()
    # 4 prompts per round: 2 all-correct, 1 all-wrong, 1 mixed -> easy share 0.5 >= 0.25/3, hard 0.25 >= 0.5/3;
    # only one mixed group per round, so two rounds
    rates = {order[i % NUM_PROMPTS]: [1.0, 1.0, 0.0, 0.5][i % 4] for i in range(NUM_PROMPTS)}
    g = make_allocator(cfg, NUM_PROMPTS)
    batch, stats = g.collect(ScriptedSampler(cfg, rates))  # epoch 0: no adaptation
    assert (stats["num_gen_batches"], stats["p_easy"], stats["p_hard"]) == (2, 0.5, 0.5)
    assert len(batch) == 2 and stats["prompts_skipped"] == 0  # no history yet: nothing skipped
    g.easy_streak[:] = 0  # no skipping in the next epoch: its rounds roll out what they draw
    g.hard_streak[:] = 0
    epoch_1 = PromptStream(NUM_PROMPTS, 0).take(NUM_PROMPTS, NUM_PROMPTS)
    rates = {epoch_1[i]: [1.0, 1.0, 0.0, 0.5][i % 4] for i in range(NUM_PROMPTS)}
    batch, stats = g.collect(ScriptedSampler(cfg, rates, step=5, cursor=NUM_PROMPTS))  # epoch 1
    # 8 groups rolled out: easy share 4/8 >= 0.25 / 3 and hard share 2/8 >= 0.25 x 2/3: both p fall
    assert stats["num_gen_batches"] == 2
    assert (stats["p_easy"], stats["p_hard"]) == pytest.approx((0.49, 0.49))
    # few zero-variance groups: p rises, within [p_min, p_max]
    g.p_easy = g.p_hard = 0.945
    g.easy_streak[:] = 0
    g.hard_streak[:] = 0
    _, stats = g.collect(ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.5), step=6, cursor=NUM_PROMPTS))
    assert (stats["p_easy"], stats["p_hard"]) == pytest.approx((0.95, 0.95))

    restored = make_allocator(cfg, NUM_PROMPTS)
    restored.load_state_dict(g.state_dict())
    assert restored.state_dict() == g.state_dict()


@pytest.mark.parametrize(
    ("target", "second_round", "expected_p"),
    [
        # 8 groups: 2 all correct (share 0.25 = T/3) and 4 all wrong (0.5 = 2T/3), both at their
        # targets: both p fall (a strict comparison, or a larger target, would raise them)
        (0.75, [1.0, 0.0, 0.0, 0.5], 0.49),
        # 1 all correct (0.125 < T/3 = 0.15, above T/4) and 2 all wrong (0.25 < 2T/3 = 0.3, above T/3):
        # both p rise (a target of T/4 for the easy share, or T/3 for the hard one, would lower them)
        (0.45, [0.5, 0.5, 0.5, 0.5], 0.51),
    ],
)
def test_greso_aims_a_third_of_the_zero_variance_target_at_easy_groups_and_two_thirds_at_hard_ones(
    target, second_round, expected_p
):
    cfg = make_cfg(
        "greso", P=2, prompts_per_round=4, min_prompts_per_round=4, p_easy=0.5, p_hard=0.5, target_zero_variance=target
    )
    g = make_allocator(cfg, NUM_PROMPTS)
    epoch_1 = PromptStream(NUM_PROMPTS, 0).take(NUM_PROMPTS, NUM_PROMPTS)
    rates = {p: 0.5 for p in range(NUM_PROMPTS)} | dict(zip(epoch_1, [1.0, 0.0, 0.0, 0.5] + second_round))
    _, stats = g.collect(ScriptedSampler(cfg, rates, step=5, cursor=NUM_PROMPTS))  # epoch 1: p adapts
    assert (stats["num_gen_batches"], stats["groups_sampled"]) == (2, 8)
    assert (stats["p_easy"], stats["p_hard"]) == pytest.approx((expected_p, expected_p))


def test_dynamic_sampling_shortfall_refill_samples_the_batch_then_what_is_missing():
    fixed = make_allocator(make_cfg("dynamic_sampling", P=8), NUM_PROMPTS)
    assert [fixed.round_size(i, 1, 0.5) for i in (0, 1)] == [24, 24]  # DAPO: 3 x P every round
    s = make_allocator(make_cfg("dynamic_sampling", P=8, refill="shortfall"), NUM_PROMPTS)
    assert s.round_size(0, 8, None) == 8  # the batch, as if every group were informative
    assert s.round_size(1, 3, 0.5) == 6  # 3 missing at half informative: ceil(3 / 0.5)
    assert s.round_size(1, 3, 0.0) == 3  # never fewer than missing
    assert s.round_size(1, 7, 0.75) == 24  # ceil(7 / 0.25) = 28, capped at 3 x P
    assert s.round_size(1, 2, 1.0) == 24  # nothing informative yet: the cap

    # the hand-worked step of the fixed-size test with P = 2: round 1 draws 2 prompts (one mixed), round
    # 2 the 1 missing over an informative share of 1/2 = 2 prompts (one mixed): nothing surplus
    order = stream_order()
    rates = dict.fromkeys(range(NUM_PROMPTS), 1.0) | {order[1]: 0.5, order[3]: 0.25}
    cfg = make_cfg("dynamic_sampling", P=2, refill="shortfall")
    sampler = ScriptedSampler(cfg, rates)
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(sampler)
    assert [c[0] for c in sampler.calls_made] == [order[0:2], order[2:4]]
    assert batch.prompt == [order[1], order[3]]
    assert (stats["groups_sampled"], stats["groups_discarded_zero_std"], stats["groups_discarded_surplus"]) == (
        4,
        2,
        0,
    )


def test_greso_refill_round_size_follows_the_zero_variance_share():
    g = make_allocator(make_cfg("greso", P=8), NUM_PROMPTS)
    assert g.round_size(0, 8, None) == 12  # 1.5 x P
    assert g.round_size(0, 1, 0.0) == 12  # the first round, whatever share is passed
    assert g.round_size(1, 1, None) == 12  # no share measured yet: the largest
    assert g.round_size(1, 4, 0.5) == 10  # ceil(4 / 0.5 x 1.25)
    assert g.round_size(1, 1, 0.0) == 2  # at least P / 4
    assert g.round_size(1, 8, 1.0) == 12
    # the floor, where it binds: P // 4 = 3 above ceil(1 x 1.25) = 2; at least one prompt when P // 4 = 0
    assert make_allocator(make_cfg("greso", P=12), NUM_PROMPTS).round_size(1, 1, 0.0) == 3
    assert make_allocator(make_cfg("greso", P=2), NUM_PROMPTS).round_size(1, 0, 0.0) == 1


def test_a_step_without_a_round_limit_stops_only_when_short_after_more_than_one_whole_pass():
    from pods_bench.allocation.base import RoundsConfig, check_not_exhausted

    unlimited, limited = RoundsConfig(max_rounds=0), RoundsConfig(max_rounds=3)
    check_not_exhausted(unlimited, "x", drawn=12, num_prompts=12, have=1, want=2, why="w")  # one whole pass: not yet
    check_not_exhausted(unlimited, "x", drawn=13, num_prompts=12, have=2, want=2, why="w")  # full: nothing to stop
    check_not_exhausted(limited, "x", drawn=13, num_prompts=12, have=1, want=2, why="w")  # its round limit stops it
    with pytest.raises(PodsBenchError) as error:
        check_not_exhausted(unlimited, "x", drawn=13, num_prompts=12, have=1, want=2, why="too few varied")
    assert str(error.value) == (
        "allocation.x: 1 of the 2 groups a step trains on after drawing every one of the 12 training prompts "
        "(too few varied)"
    )


def test_growing_groups_refuse_outcomes_out_of_the_order_asked_for():
    """A sampler whose outcomes come back in another order would join rollouts to the wrong group."""
    from pods_bench.allocation.base import GrowingGroups

    class Reversed(ScriptedSampler):
        def sample(self, prompts, k, owners=None, repeats=1):
            local, everyone = super().sample(prompts, k, owners, repeats)
            return local, everyone[::-1]

    cfg = make_cfg("hora")
    sampler = ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.5))
    local, everyone = sampler.sample([3, 5], 2)
    with pytest.raises(ValueError) as error:
        GrowingGroups(sampler, [5, 3], local, everyone)
    assert str(error.value) == "GrowingGroups: the graded groups are not those of the draw, in its order"
    groups = GrowingGroups(sampler, [3, 5], local, everyone)
    with pytest.raises(ValueError) as error:
        groups.add(Reversed(cfg, sampler.rates), [0, 1], 2)
    assert str(error.value) == "GrowingGroups: the graded groups are not those asked for, in that order"
    assert [g.prompt for g in groups.add(sampler, [1, 0], 2)] == [5, 3]  # any order asked for, kept


def test_the_step_shape_is_the_configs_prompts_rollouts_and_groups_per_prompt():
    from pods_bench.allocation import step_shape

    selection = {"rule": "all", "n": 4, "m": 4, "groups_per_prompt": 2}
    cfg = config_from_dict({"prompts_per_step": 3, "selection": selection, "budget": {"max_steps": 1}})
    assert step_shape(cfg) == StepShape(prompts_per_step=3, n=4, groups_per_prompt=2)


# --- Pilot-Commit --------------------------------------------------------------------------------------


def test_pilot_commit_pass_window_includes_both_ends():
    """n_p = 8 pilots: pass rates 1/8 and 6/8 are the window's ends [0.125, 0.75] and are buffered;
    0/8 and 7/8 just outside it are not (an exclusive end at either side fails here)."""
    order = stream_order()
    rates = {order[0]: 0.0, order[1]: 0.125, order[2]: 0.75, order[3]: 0.875}
    cfg = make_cfg("pilot_commit", n=16, P=2, pilot_prompts=4, pilot_rollouts=8, max_rounds=1, when_short="train")
    pc = make_allocator(cfg, NUM_PROMPTS)
    batch, stats = pc.collect(ScriptedSampler(cfg, rates))
    assert len(batch) == 0 and stats["prompts_buffered"] == 2  # round 1 pilots only; nothing to commit yet
    assert stats["commit_age_mean"] is None  # no commit: no age (not NaN)
    assert sorted(pc.buffer) == sorted([order[1], order[2]])
    assert pc.evicted == set()  # 7/8 is below the solve threshold 1
    # what a checkpoint keeps of each: (prompt, step piloted, owner, pass rate, std of its correctness)
    stds = [math.sqrt(0.125 * 0.875), math.sqrt(0.75 * 0.25)]  # a 0/1 group's std: sqrt(p (1 - p))
    kept = pc.state_dict()["buffer"]
    assert [entry[:4] for entry in kept] == [(order[1], 0, 0, 0.125), (order[2], 0, 0, 0.75)]
    assert [entry[4] for entry in kept] == pytest.approx(stds)
    resumed = make_allocator(cfg, NUM_PROMPTS)
    pc.evicted = {order[3]}  # as if solved: a checkpoint keeps it too
    resumed.load_state_dict(pc.state_dict())
    assert (resumed.buffer, resumed.evicted, list(resumed.pilots)) == (pc.buffer, {order[3]}, list(pc.pilots))


def test_pilot_commit_buffers_commits_and_evicts_by_pilot_pass_rate():
    order = stream_order()
    # n = 8: n_p = 2 pilot rollouts, n_c = 6 commit rollouts; pass window [0.125, 0.75]
    rates = dict.fromkeys(range(NUM_PROMPTS), 0.0)
    rates |= {order[0]: 0.5, order[1]: 1.0, order[3]: 0.5, order[4]: 0.5}
    cfg = make_cfg("pilot_commit", P=2, pilot_prompts=3)
    pc = make_allocator(cfg, NUM_PROMPTS)
    sampler = ScriptedSampler(cfg, rates)
    batch, stats = pc.collect(sampler)

    # round 1: nothing to commit; pilots order[0:3]: order[0] buffered, order[1] solved (evicted)
    # round 2: commit order[0]; pilots order[3:6]: order[3], order[4] buffered
    # round 3: commit one of order[3], order[4] (random); pilots order[6:9]: none buffered
    assert [c for c in sampler.calls_made] == [
        ([], 6),
        (order[0:3], 2),
        ([order[0]], 6),
        (order[3:6], 2),
        ([batch.prompt[1]], 6),
        (order[6:9], 2),
    ]
    assert batch.prompt[0] == order[0] and batch.prompt[1] in (order[3], order[4])
    assert batch.sizes == [8, 8]  # pilot + commit rollouts as one group of n
    assert [c[1] for c in batch.completion_ids[0]] == [0] * 8  # all sampled at step 0
    assert batch.of_group("rewards", 0).tolist() == [1, 0] + [1, 1, 1, 0, 0, 0]  # pilot (2) then commit (6)
    assert pc.evicted == {order[1]}
    assert list(pc.buffer) == [p for p in (order[3], order[4]) if p != batch.prompt[1]]
    assert stats == {
        "num_gen_batches": 3,
        "groups_sampled": 2 + 9,
        "rollouts_pilot": 9 * 2,
        "rollouts_commit": 2 * 6,
        "prompts_buffered": 3,
        "buffer_size": 1,
        "prompts_evicted": 1,
        "commit_age_mean": 0.0,
    }

    # the next step commits the one left at once: its pilot is one step old
    left, cursor = list(pc.buffer)[0], sampler.cursor
    pc.settings = ALLOCATION_STRATEGIES.typed_settings(
        make_cfg("pilot_commit", P=2, pilot_prompts=3, max_rounds=1, when_short="train").allocation
    )
    batch, stats = pc.collect(ScriptedSampler(cfg, rates, step=1, cursor=cursor))
    assert batch.prompt == [left] and stats["commit_age_mean"] == 1.0 and stats["num_gen_batches"] == 1

    # an evicted prompt is never piloted again, though the next epoch's order holds it
    pc.settings = ALLOCATION_STRATEGIES.typed_settings(
        make_cfg("pilot_commit", P=2, pilot_prompts=3, max_rounds=3, when_short="train").allocation
    )
    sampler = ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.0), step=2, cursor=NUM_PROMPTS)
    pc.collect(sampler)
    piloted = [p for prompts, k in sampler.calls_made if k == 2 for p in prompts]
    drawn = PromptStream(NUM_PROMPTS, 0).take(NUM_PROMPTS, sampler.cursor - NUM_PROMPTS)
    assert len(piloted) == 9 and order[1] not in piloted
    assert sorted(piloted + [order[1]] * (order[1] in drawn)) == sorted(drawn)


def test_pilot_commit_drops_pilots_older_than_max_off_steps_and_orders_commits_by_std():
    from pods_bench.allocation.pilot_commit import Buffered

    cfg = make_cfg("pilot_commit", P=1, pilot_prompts=3, max_off_steps=1, commit_order="max_std", max_rounds=1)
    pc = make_allocator(cfg, NUM_PROMPTS)
    pc.buffer = {5: Buffered(0, 0, 0.5, 0.5), 6: Buffered(3, 0, 0.25, 0.433), 7: Buffered(2, 0, 0.5, 0.5)}
    # highest std first, ties to the more recent pilot
    assert pc.choose_commits(np.random.default_rng(0), 2) == [7, 5]
    assert pc.choose_commits(np.random.default_rng(0), 5) == [5, 6, 7]  # all, when no more are buffered

    # at step 2 the commit takes 7 (std 0.5, newer than 5); then 5 (2 steps old) is dropped, 6 stays
    pc.buffer = {5: Buffered(0, 0, 0.5, 0.5), 6: Buffered(1, 0, 0.5, 0.2), 7: Buffered(1, 0, 0.5, 0.6)}
    pc.pilots = {p: scripted_pilot(p, step) for p, step in [(5, 0), (6, 1), (7, 1)]}
    batch, stats = pc.collect(ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.0), step=2))
    assert batch.prompt == [7] and stats["commit_age_mean"] == 1.0
    assert list(pc.buffer) == [6] and list(pc.pilots) == [6]


def test_pilot_commit_age_is_the_mean_over_every_commit_of_the_step():
    from pods_bench.allocation.pilot_commit import Buffered

    order = stream_order()
    cfg = make_cfg("pilot_commit", P=2, pilot_prompts=3, max_rounds=2)
    pc = make_allocator(cfg, NUM_PROMPTS)
    old = order[5]  # not among this step's pilots, order[0:3]
    pc.buffer, pc.pilots = {old: Buffered(0, 0, 0.5, 0.5)}, {old: scripted_pilot(old, 0)}
    rates = dict.fromkeys(range(NUM_PROMPTS), 0.0) | {order[0]: 0.5}
    batch, stats = pc.collect(ScriptedSampler(cfg, rates, step=2))
    # round 1 commits the step-0 pilot (2 steps old) and pilots order[0], round 2 commits it (0 steps old)
    assert batch.prompt == [old, order[0]] and stats["commit_age_mean"] == 1.0


def test_pilot_commit_a_buffered_prompt_piloted_again_leaves_the_buffer_when_it_is_out_of_the_window():
    from pods_bench.allocation.pilot_commit import Buffered

    # every prompt buffered (as after an epoch), every pilot of this step solved: the three re-piloted
    # prompts are evicted and leave the buffer, and no later commit can take them
    cfg = make_cfg("pilot_commit", P=1, pilot_prompts=3, max_rounds=1, when_short="train")
    pc = make_allocator(cfg, NUM_PROMPTS)
    pc.buffer = {p: Buffered(0, 0, 0.5, 0.5) for p in range(NUM_PROMPTS)}
    pc.pilots = {p: scripted_pilot(p, 0) for p in range(NUM_PROMPTS)}
    sampler = ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 1.0), step=1)
    batch, stats = pc.collect(sampler)
    piloted = sampler.calls_made[1][0]
    assert sampler.calls_made[1][1] == 2 and len(piloted) == 3
    assert pc.evicted == set(piloted)
    assert not set(pc.buffer) & pc.evicted and set(pc.buffer) == set(pc.pilots)
    assert set(pc.buffer) == set(range(NUM_PROMPTS)) - set(batch.prompt) - set(piloted)
    assert stats["buffer_size"] == len(pc.buffer) and stats["prompts_evicted"] == 3
    for step in (2, 3):  # the rest of the buffer is committed, never an evicted prompt
        evicted_before = set(pc.evicted)
        batch, _ = pc.collect(ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 1.0), step=step))
        assert len(batch) == 1 and not set(batch.prompt) & evicted_before
        assert not set(pc.buffer) & pc.evicted


def test_pilot_commit_with_every_prompt_evicted_commits_the_buffer_or_stops_before_sampling():
    from pods_bench.allocation.pilot_commit import Buffered

    cfg = make_cfg("pilot_commit", P=2, pilot_prompts=3)
    pc = make_allocator(cfg, NUM_PROMPTS)
    pc.evicted = set(range(NUM_PROMPTS))
    pc.buffer = {p: Buffered(0, 0, 0.5, 0.5) for p in (3, 4)}
    pc.pilots = {p: scripted_pilot(p, 0) for p in (3, 4)}
    sampler = ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.5), step=1)
    batch, stats = pc.collect(sampler)  # the buffer fills the batch: no error, no pilots
    assert sorted(batch.prompt) == [3, 4] and stats["rollouts_pilot"] == 0
    assert [prompts for prompts, k in sampler.calls_made if k == 2] == [[]]

    pc.buffer = {5: Buffered(1, 0, 0.5, 0.5)}
    pc.pilots = {5: scripted_pilot(5, 1)}
    sampler = ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.5), step=2)
    with pytest.raises(PodsBenchError) as error:
        pc.collect(sampler)
    assert str(error.value) == (
        "allocation.pilot_commit: all 12 training prompts are evicted as solved (pilot pass rate >= "
        "solve_threshold=1.0) and the buffer holds 1 of the 2 prompts the batch still needs; raise it, or null: "
        "no eviction"
    )
    assert sampler.calls_made == []  # nothing was sampled for a step that cannot be filled


def test_pilot_commit_random_order_commits_distinct_buffered_prompts_in_buffer_order_every_subset_alike():
    from scipy.stats import chisquare

    from pods_bench.allocation.pilot_commit import Buffered

    cfg = make_cfg("pilot_commit", P=2, pilot_prompts=3, commit_order="random", max_rounds=1, when_short="train")
    pc = make_allocator(cfg, NUM_PROMPTS)
    pc.buffer = {p: Buffered(0, 0, 0.5, 0.5) for p in (9, 2, 7, 4)}  # entered in this order
    position = {p: i for i, p in enumerate(pc.buffer)}
    seen = Counter()
    for seed in range(600):
        chosen = pc.choose_commits(np.random.default_rng(seed), 2)
        assert len(set(chosen)) == len(chosen) == 2 and set(chosen) <= set(pc.buffer), chosen
        assert [position[p] for p in chosen] == sorted(position[p] for p in chosen), chosen
        seen[tuple(chosen)] += 1
    assert len(seen) == 6 and chisquare(list(seen.values())).pvalue > 1e-3, seen  # each pair ~1/6 of the time
    assert pc.choose_commits(np.random.default_rng(0), 4) == [9, 2, 7, 4]  # all, when no more are buffered

    # in a step, the commit's draw is the sampler's generator of that round (the same on every
    # process and after a resume)
    pc.pilots = {p: scripted_pilot(p, 0) for p in pc.buffer}
    expected = pc.choose_commits(ScriptedSampler(cfg, {}, step=1).rng(0), 2)
    batch, _ = pc.collect(ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.0), step=1))
    assert batch.prompt == expected


def test_pilot_commit_without_a_round_limit_stops_after_one_whole_pass_over_the_prompts():
    """max_rounds 0 and no pilot ever in the window (the buffer stays empty): 3 pilots a round draw
    3, 6, 9, 12 of the 12 prompts and then 15, more than a pass, so the 5th round is the last."""
    cfg = make_cfg("pilot_commit", P=2, pilot_prompts=3, max_rounds=0)
    pc = make_allocator(cfg, NUM_PROMPTS)
    sampler = ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.0))
    with pytest.raises(PodsBenchError) as error:
        pc.collect(sampler)
    assert str(error.value) == (
        "allocation.pilot_commit: 0 of the 2 groups a step trains on after drawing every one of the 12 training "
        "prompts (too few piloted prompts had a pass rate in the window)"
    )
    assert [k for _, k in sampler.calls_made] == [6, 2] * 5  # commit (nothing buffered), then 3 pilots


def test_pilot_commit_stops_when_every_prompt_is_evicted_and_the_buffer_cannot_fill_the_batch():
    from pods_bench.allocation.pilot_commit import Buffered

    pc = make_allocator(make_cfg("pilot_commit", P=4, solve_threshold=0.9), NUM_PROMPTS)
    pc.buffer = {7: Buffered(step=0, owner=0, pass_rate=0.5, std=0.5)}
    pc.check_can_fill(have=1, want=4)  # prompts are left to pilot: nothing to stop yet
    pc.evicted = set(range(NUM_PROMPTS))
    pc.check_can_fill(have=3, want=4)  # 3 + the 1 buffered fill it
    with pytest.raises(PodsBenchError) as error:
        pc.check_can_fill(have=1, want=4)
    assert str(error.value) == (
        "allocation.pilot_commit: all 12 training prompts are evicted as solved (pilot pass rate >= "
        "solve_threshold=0.9) and the buffer holds 1 of the 3 prompts the batch still needs; raise it, or null: "
        "no eviction"
    )


def scripted_pilot(prompt: int, step: int) -> Groups:
    return Groups(
        [prompt],
        [[prompt]],
        [[[prompt, step, 0], [prompt, step, 1]]],
        np.array([[1.0, 0.0]]),
        np.array([[1.0, 0.0]]),
        np.zeros((1, 2)),
        [step],
    )


def test_pilot_commit_sizes_default_to_a_quarter_of_n_and_three_batches_of_prompts():
    pc = make_allocator(make_cfg("pilot_commit", n=4, m=4, P=2), NUM_PROMPTS)
    assert (pc.n_pilot, pc.n_commit, pc.pilot_prompts) == (1, 3, 6)  # n // 4 pilot rollouts, 3 x P prompts
    pc = make_allocator(make_cfg("pilot_commit", n=16, m=16, P=3), NUM_PROMPTS)
    assert (pc.n_pilot, pc.n_commit, pc.pilot_prompts) == (4, 12, 9)
    # the ends of 1..n - 1 are accepted, 0 (a quarter of n = 3, floored) is not
    for pilot in (1, 7):
        assert make_allocator(make_cfg("pilot_commit", n=8, pilot_rollouts=pilot), NUM_PROMPTS).n_pilot == pilot
    with pytest.raises(PodsBenchError) as error:
        make_cfg("pilot_commit", n=3, m=3)
    assert str(error.value) == (
        "config key allocation.pilot_commit.pilot_rollouts must be in 1..selection.n - 1 = 2 "
        "(pilot and commit rollouts make up the n of a group), got 0"
    )


def test_pilot_commit_bad_settings_stop_with_one_line():
    with pytest.raises(PodsBenchError) as error:
        make_cfg("pilot_commit", n=8, pilot_rollouts=8)
    assert str(error.value) == (
        "config key allocation.pilot_commit.pilot_rollouts must be in 1..selection.n - 1 = 7 "
        "(pilot and commit rollouts make up the n of a group), got 8"
    )
    cfg = make_cfg("pilot_commit", P=2, pilot_prompts=3)
    pc = make_allocator(cfg, NUM_PROMPTS)
    pc.evicted = set(range(NUM_PROMPTS))
    with pytest.raises(PodsBenchError, match=r"^allocation.pilot_commit: all 12 training prompts are evicted"):
        pc.collect(ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 1.0)))
    # nothing ever enters the buffer: the round limit stops it
    cfg = make_cfg("pilot_commit", P=2, pilot_prompts=3, max_rounds=4)
    pc = make_allocator(cfg, NUM_PROMPTS)
    with pytest.raises(PodsBenchError) as error:
        pc.collect(ScriptedSampler(cfg, dict.fromkeys(range(NUM_PROMPTS), 0.0)))
    assert str(error.value) == (
        "allocation.pilot_commit: 0 of the 2 groups a step trains on after 4 rounds (too few piloted prompts had a "
        "pass rate in the window); raise allocation.pilot_commit.max_rounds (0: no limit) or set "
        "allocation.pilot_commit.when_short=train"
    )
    with pytest.raises(PodsBenchError, match="pass window"):
        make_cfg("pilot_commit", pass_low=0.9)


# --- VIGOR and HORA: groups of different sizes ----------------------------------------------------------


def test_vigor_grows_the_groups_of_the_prompts_whose_rewards_vary_most():
    order = PromptStream(NUM_PROMPTS, 0).take(0, 8)
    # 8 prompts, m0 = 2, alpha 0.5, gamma 2, T = 4: active 8, 4, 2, 1; 2 + 4 + 8 + 16 rollouts
    # for the last one. Pass rates: four at 0.5 (mixed from the first two rollouts), four at 0 or 1.
    rates = dict.fromkeys(range(NUM_PROMPTS), 0.0) | {order[i]: 0.5 for i in (1, 2, 5, 7)} | {order[3]: 1.0}
    cfg = make_cfg("vigor", n=8, m=8, P=8)
    sampler = ScriptedSampler(cfg, rates)
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(sampler)
    assert batch.prompt == order  # in the order drawn
    # the mixed four stay in round 2; then ties (every mixed group varies by 0.25) go to the earliest
    assert dict(zip(batch.prompt, batch.sizes)) == {
        order[0]: 2,
        order[1]: 30,
        order[2]: 14,
        order[3]: 2,
        order[4]: 2,
        order[5]: 6,
        order[6]: 2,
        order[7]: 6,
    }
    assert sorted(batch.sizes) == [2, 2, 2, 2, 6, 6, 14, 30] and sum(batch.sizes) == 8 * 8
    assert [(prompts, k) for prompts, k in sampler.calls_made] == [
        (order, 2),
        ([order[1], order[2], order[5], order[7]], 4),
        ([order[1], order[2]], 8),
        ([order[1]], 16),
    ]
    assert stats == {"num_gen_batches": 4, "groups_sampled": 15, "group_size_min": 2, "group_size_max": 30}
    # each group's rollouts in the order sampled: round 1's, then round 2's, ...
    assert [c[1:] for c in batch.completion_ids[2]] == [[0, j] for j in (0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7)]


def test_hora_allocates_the_rest_of_the_budget_by_marginal_hit_utility():
    from pods_bench.allocation.hora import allocate, hit_utility

    # Beta(1, 5), Beta(3, 3), Beta(5, 1): utilities E[p (1 - p)^l] by hand
    assert hit_utility(1, 5, 0) == pytest.approx(1 / 6) and hit_utility(1, 5, 1) == pytest.approx(5 / 42)
    assert hit_utility(3, 3, 0) == pytest.approx(0.5) and hit_utility(3, 3, 1) == pytest.approx(180 / 840)
    assert hit_utility(5, 1, 0) == pytest.approx(5 / 6) and hit_utility(5, 1, 1) == pytest.approx(5 / 42)
    # the 12 largest: 5/6, 1/2, 3/14, 1/6, 5/42, 5/42, 3/28, 5/56, 5/72, 5/84, 1/18, 1/22 -> (6, 4, 2)
    assert allocate([0, 2, 4], probes=4, extra=12) == [6, 4, 2]
    assert allocate([0, 2, 4], probes=4, extra=0) == [0, 0, 0]
    assert allocate([2, 2], probes=4, extra=3) == [2, 1]  # equal utilities: the earlier prompt first

    order = PromptStream(NUM_PROMPTS, 0).take(0, 3)
    rates = dict.fromkeys(range(NUM_PROMPTS), 0.0) | {order[1]: 0.5, order[2]: 1.0}
    cfg = make_cfg("hora", n=8, m=8, P=3, probe_rollouts=4)
    sampler = ScriptedSampler(cfg, rates)
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(sampler)
    assert sampler.calls_made == [(order, 4), ([order[2]], 2), ([order[1]], 4), ([order[0]], 6)]
    assert batch.prompt == order and batch.sizes == [10, 8, 6] and sum(batch.sizes) == 3 * 8
    assert stats == {"num_gen_batches": 4, "groups_sampled": 6, "group_size_min": 6, "group_size_max": 10}
    # n = 5: 3 extra rollouts, the top 3 marginals 5/6, 1/2, 3/14 -> (0, 2, 1): a prompt that gets none
    # is sampled no more, one that gets a single extra rollout is
    assert allocate([0, 2, 4], probes=4, extra=3) == [0, 2, 1]
    cfg = make_cfg("hora", n=5, m=5, P=3, probe_rollouts=4)
    sampler = ScriptedSampler(cfg, rates)
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(sampler)
    assert sampler.calls_made == [(order, 4), ([order[2]], 1), ([order[1]], 2)]
    assert batch.sizes == [4, 6, 5] and stats["num_gen_batches"] == 3 and stats["groups_sampled"] == 5


class TaggedSampler(ScriptedSampler):
    """ScriptedSampler whose rollouts carry (prompt, call, row, rollout): every rollout is told apart."""

    def sample(self, prompts, k, owners=None, repeats=1):
        local, everyone = super().sample(prompts, k, owners, repeats)
        call = len(self.calls_made)
        local.completion_ids = [[[p, call, row, j] for j in range(k)] for row, p in enumerate(local.prompt)]
        return local, everyone


class RoundSampler(ScriptedSampler):
    """Scripted rewards that change from one sampling call to the next: `script[call][prompt]` is
    the k rewards prompt gets in that call (any real values; correct = reward above 0.5)."""

    def __init__(self, cfg, script: list[dict[int, list[float]]]):
        super().__init__(cfg, {})
        self.script = script

    def sample(self, prompts, k, owners=None, repeats=1):
        call = len(self.calls_made)
        self.calls_made.append((list(prompts), k))
        rewards = np.array([self.script[call][p] for p in prompts], dtype=float).reshape(len(prompts), k)
        correct = (rewards > 0.5).astype(float)
        local = Groups(
            list(prompts),
            [[p] for p in prompts],
            [[[p, call, j] for j in range(k)] for p in prompts],
            rewards,
            correct,
            np.zeros_like(rewards),
            [self.step] * len(prompts),
        )
        everyone = [Graded(p, 0, row, tuple(rewards[row]), tuple(correct[row])) for row, p in enumerate(prompts)]
        return local, everyone


def test_vigor_keeps_its_share_and_ranks_by_the_variance_of_all_rewards_so_far():
    # keep_share 0.25 (alpha x gamma = 1 with gamma 4): 16 prompts, then 4, then 1
    schedule = VigorConfig(initial_rollouts=1, keep_share=0.25, growth=4, rounds=3).schedule(16)
    assert schedule == [(16, 1), (4, 4), (1, 16)]
    # P = 4, m0 = 2, alpha 0.5, gamma 2, T = 3: active 4, 2, 1. Round 1: A [1, 0] and B [0.6, 0.4] vary
    # (C, D do not). Round 2: A [1, 1, 1, 1] (this round's variance 0; all six 0.139), B [0.4, 0.6,
    # 0.4, 0.6] (this round's 0.01; all six 0.01): the cumulative variance keeps A, the last round's B
    order = stream_order()
    a, b, c, d = order[:4]
    script = [
        {a: [1, 0], b: [0.6, 0.4], c: [1, 1], d: [0, 0]},
        {a: [1, 1, 1, 1], b: [0.4, 0.6, 0.4, 0.6]},
        {a: [1, 0, 1, 0, 1, 0, 1, 0], b: [0.5] * 8},
    ]
    cfg = make_cfg("vigor", n=6, m=6, P=4, initial_rollouts=2, keep_share=0.5, growth=2, rounds=3)
    sampler = RoundSampler(cfg, script)
    batch, _ = make_allocator(cfg, NUM_PROMPTS).collect(sampler)
    assert sampler.calls_made == [([a, b, c, d], 2), ([a, b], 4), ([a], 8)]
    assert batch.sizes == [14, 6, 2, 2]


@pytest.mark.parametrize("strategy", ["vigor", "hora"])
def test_vigor_and_hora_give_a_prompt_drawn_twice_in_one_step_a_group_per_slot(strategy):
    # 12 prompts, 8 a step: the second step's draw crosses the epoch boundary and holds prompt 1 twice
    draw = PromptStream(NUM_PROMPTS, 0).take(8, 8)
    assert draw == [6, 10, 8, 1, 0, 7, 1, 11]
    rates = dict.fromkeys(range(NUM_PROMPTS), 0.0) | {1: 0.5, 10: 0.5}
    settings = {"probe_rollouts": 4} if strategy == "hora" else {}
    cfg = make_cfg(strategy, n=8, m=8, P=8, **settings)
    sampler = TaggedSampler(cfg, rates, step=1, cursor=8)
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(sampler)
    assert batch.prompt == draw  # one group a slot, in the order drawn
    if strategy == "vigor":
        # round 1 (2 each): slots 1, 3, 6 vary; active 0, 1, 3, 6 -> 1, 3 (slot 0 never varies) -> 1
        assert batch.sizes == [6, 30, 2, 14, 2, 2, 6, 2]
    else:
        from pods_bench.allocation.hora import allocate

        extra = allocate([2 if p in (1, 10) else 0 for p in draw], probes=4, extra=8 * 4)
        assert batch.sizes == [4 + e for e in extra] and extra[3] == extra[6] > 0
    # every rollout sampled is trained once, in its own slot's group, with its own outcome
    rollouts = [tuple(c) for group in batch.completion_ids for c in group]
    assert len(rollouts) == len(set(rollouts)) == sum(batch.sizes) == 8 * 8 == sampler.counts["rollouts_generated"]
    assert all(c[0] == p for p, group in zip(batch.prompt, batch.completion_ids) for c in group)
    assert stats["group_size_min"] == min(batch.sizes) and stats["group_size_max"] == max(batch.sizes)
    for g, p in enumerate(batch.prompt):
        right = batch.of_group("correct", g)
        assert right.mean() == rates[p] and len(right) == batch.sizes[g]


def test_hora_breaks_exact_ties_by_draw_order_not_by_rounding():
    from fractions import Fraction

    from pods_bench.allocation.hora import allocate, hit_utility

    # probes of 2: Beta(1, 3) (0 right) and Beta(2, 2) (1 right). Marginals 1/4, 3/20, 1/10, ... and
    # 1/2, 1/5, 1/10, ...: the fifth extra rollout is a tie at exactly 1/10, which goes to the first prompt
    assert hit_utility(1, 3, 2) == hit_utility(2, 2, 2) == Fraction(1, 10)
    assert allocate([0, 1], probes=2, extra=4) == [2, 2]
    assert allocate([0, 1], probes=2, extra=5) == [3, 2]
    # more exact ties (the float utilities of log-gamma had the later prompt win each of them)
    assert allocate([0, 1], probes=3, extra=2) == [1, 1]  # Beta(1, 4), Beta(2, 3): 2/5, then a tie at 1/5
    assert allocate([0, 1], probes=1, extra=6) == [4, 2]
    assert allocate([4, 1], probes=4, extra=4) == [2, 2]
    assert allocate([], probes=4, extra=4) == []  # no prompt (a rank with none): nothing to give


def test_vigor_and_hora_bad_settings_stop_with_one_line():
    with pytest.raises(PodsBenchError) as error:
        make_cfg("vigor", n=16, m=16, P=8)
    assert str(error.value) == (
        "config key allocation.vigor: its rounds spend 64 rollouts a step (8 x 2 + 4 x 4 + 2 x 8 + 1 x 16), the "
        "budget is prompts_per_step x selection.n = 8 x 16 = 128; choose initial_rollouts, keep_share, growth and "
        "rounds that spend it (e.g. selection.n = initial_rollouts x rounds with keep_share x growth = 1)"
    )
    make_cfg("vigor", n=16, m=16, P=8, initial_rollouts=4)  # 4 x 4 = 16: fits
    with pytest.raises(PodsBenchError, match=r"^config key allocation.vigor.keep_share must be in \(0, 1\]$"):
        make_cfg("vigor", n=8, m=8, P=8, keep_share=0)
    for probes in (1, 7):  # the ends of 1..n - 1
        assert (
            make_allocator(make_cfg("hora", n=8, m=8, probe_rollouts=probes), NUM_PROMPTS).settings.probe_rollouts
            == probes
        )
    with pytest.raises(PodsBenchError) as error:
        make_cfg("hora", n=8, m=8, probe_rollouts=8)
    assert str(error.value) == (
        "config key allocation.hora.probe_rollouts must be in 1..selection.n - 1 = 7 (the probe is part of the n "
        "rollouts a prompt gets on average), got 8"
    )


# --- configuration -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["allocation.strategy=dapo"], "config key allocation.strategy: unknown strategy 'dapo'; choose from "),
        (
            ["allocation.strategy=greso", "selection.groups_per_prompt=2"],
            "config key selection.groups_per_prompt: allocation strategy 'greso' samples one group per prompt",
        ),
        (
            ["allocation.greso.p_min=0.9", "allocation.greso.p_max=0.5"],
            "config key allocation.greso.p_min must be <= p_max",
        ),
        (
            ["allocation.dynamic_sampling.max_rounds=-1"],
            "config key allocation.dynamic_sampling.max_rounds must be >= 0",
        ),
        (["selection.scope=batch"], "config key selection.scope: 'batch' (CPPO's batch-level pruning) needs rule"),
    ],
)
def test_bad_allocation_settings_are_one_line(overrides, message):
    with pytest.raises(PodsBenchError) as error:
        validate(config_from_dict({"budget": {"max_steps": 1}}, overrides))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_every_strategy_is_registered_and_composes_with_every_rule():
    # the built-in ones at least; a strategy added later is looped over below without an edit here
    assert set(ALLOCATION_STRATEGIES) >= {
        "uniform",
        "dynamic_sampling",
        "greso",
        "pilot_commit",
        "vigor",
        "hora",
        "reward_variance_filter",
    }
    for strategy in ALLOCATION_STRATEGIES:
        for rule, m in [("max_variance", 4), ("random", 4), ("max_abs_advantage", 4), ("all", 8)]:
            cfg = config_from_dict(
                {
                    "selection": {"rule": rule, "n": 8, "m": m},
                    "allocation": {"strategy": strategy},
                    "budget": {"max_steps": 1},
                }
            )
            validate(cfg)


# --- CPPO ---------------------------------------------------------------------------------------------


def cppo_cfg(scope: str, advantage_over: str):
    return config_from_dict(
        {
            "selection": {
                "rule": "max_abs_advantage",
                "n": 4,
                "m": 2,
                "scope": scope,
                "advantage_over": advantage_over,
            },
            "budget": {"max_steps": 1},
        }
    )


def test_cppo_keeps_the_advantages_over_all_n_and_prunes_over_the_batch():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    groups = Groups(
        [0, 1],
        [[10], [11]],
        [[[0], [1], [2], [3]], [[4], [5], [6], [7]]],
        rewards.numpy(),
        rewards.numpy(),
        np.zeros((2, 4)),
        [0, 0],
    )
    # over all n, unbiased std: group 0 mean 0.25, std 0.5 -> A = 1.5, -0.5, -0.5, -0.5;
    # group 1 mean 0.5, std 0.577 -> A = +-0.866
    kept = keep_rollouts(groups, cppo_cfg("group", "all"), torch.Generator())
    assert [s.completion_ids for s in kept.sequences] == [[0], [1], [4], [5]]
    assert kept.sequences[0].advantage == pytest.approx(0.75 / (0.5 + 1e-4))
    assert kept.sequences[1].advantage == pytest.approx(-0.25 / (0.5 + 1e-4))  # not renormalised over the kept 2
    # batch scope: the 4 largest |A| of the batch: 1.5 and group 1's four 0.866s -> 1.5 and the first three
    kept = keep_rollouts(groups, cppo_cfg("batch", "all"), torch.Generator())
    assert [s.completion_ids for s in kept.sequences] == [[0], [4], [5], [6]]
    assert kept.rewards.tolist() == [1.0, 1.0, 1.0, 0.0]
    # PODS-style: renormalised over the kept (the default)
    kept = keep_rollouts(groups, cppo_cfg("group", "kept"), torch.Generator())
    assert all(isinstance(s, KeptRollout) for s in kept.sequences)
    assert kept.sequences[0].advantage == pytest.approx(0.5 / (0.7071 + 1e-4), rel=1e-3)


# --- RAGEN-2's reward-variance filter ---------------------------------------------------------------


def test_the_reward_variance_filter_keeps_the_highest_std_groups_worked_by_hand():
    from pods_bench.allocation.reward_variance_filter import kept_groups

    stds = [0.5, 0.0, 0.4, 0.1, 0.5]  # summed 1.5: top-p 0.9 needs 1.35 - 0.01 = 1.34
    assert kept_groups(stds, "top_p", 0.9, False) == [0, 2, 4]  # 0.5 + 0.5 + 0.4 = 1.4 (ties: draw order)
    assert kept_groups(stds, "top_p", 0.5, False) == [0, 4]  # 0.5 < 0.74 <= 1.0
    assert kept_groups(stds, "top_p", 1.0, True) == [0, 1, 2, 3, 4]  # RAGEN's "no filter" preset
    assert kept_groups(stds, "top_p", 0.5, True) == [0, 4]  # zero std allowed, but top-p still filters
    assert kept_groups(stds, "top_k", 0.5, True) == [0, 4]  # int(0.5 x 5) = 2
    assert kept_groups(stds, "top_k", 1.0, False) == [0, 2, 3, 4]  # zero std excluded first
    assert kept_groups([0.0, 0.0], "top_p", 0.9, False) == []  # nothing varies: nothing trains
    assert kept_groups([0.0, 0.0], "top_k", 0.1, True) == [0]  # top_k keeps at least one
    # top_p stops once the kept stds reach value x total - 0.01 (RAGEN's selection_eps), a tie included
    assert kept_groups([0.5, 0.5], "top_p", 0.5, False) == [0]  # 0.5 >= 0.5 x 1.0 - 0.01
    assert kept_groups([0.25] * 4, "top_p", 0.51, False) == [0, 1]  # 0.5 == 0.51 x 1.0 - 0.01 exactly


def test_the_reward_variance_filter_trains_a_short_batch_and_counts_why():
    order = stream_order()
    # P = 4 groups of 8: pass rates 0.5, 1, 0.25, 0.125: stds 0.5, 0, 0.433, 0.331 (sum 1.264);
    # top-p 0.9 needs 1.128: 0.5 + 0.433 = 0.933, + 0.331 = 1.264: all three that vary
    rates = {order[0]: 0.5, order[1]: 1.0, order[2]: 0.25, order[3]: 0.125}
    cfg = make_cfg("reward_variance_filter", P=4)
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(ScriptedSampler(cfg, rates))
    assert batch.prompt == [order[0], order[2], order[3]]
    assert stats == {
        "num_gen_batches": 1,
        "groups_sampled": 4,
        "groups_discarded_zero_std": 1,
        "groups_discarded_low_std": 0,
    }
    # top-p 0.6 (0.748 needed): the two highest, the 0.125 group discarded for its low std
    cfg = make_cfg("reward_variance_filter", P=4, value=0.6)
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(ScriptedSampler(cfg, rates))
    assert batch.prompt == [order[0], order[2]] and stats["groups_discarded_low_std"] == 1
    with pytest.raises(PodsBenchError, match="reward_variance_filter.value must be in"):
        make_cfg("reward_variance_filter", value=1.5)
    # top-k with the settings handed over: pass rates 0.5, 0.375, 0.125, 1 (stds 0.5, 0.484, 0.331, 0)
    rates = {order[0]: 0.5, order[1]: 0.375, order[2]: 0.125, order[3]: 1.0}
    for settings, kept, zero, low in [
        ({"keep": "top_k", "value": 0.75}, order[:3], 1, 0),  # int(0.75 x 4) = 3 (top-p 0.75 would keep 2)
        ({"keep": "top_k", "value": 1.0, "include_zero": True}, order[:4], 0, 0),  # the zero-std group too
        ({"keep": "top_k", "value": 1.0}, order[:3], 1, 0),
    ]:
        cfg = make_cfg("reward_variance_filter", P=4, **settings)
        batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(ScriptedSampler(cfg, rates))
        assert batch.prompt == kept, settings
        assert (stats["groups_discarded_zero_std"], stats["groups_discarded_low_std"]) == (zero, low), settings


def test_hora_allocation_matches_the_top_marginals_of_the_beta_posteriors_computed_with_scipy():
    """allocate() against an independent reference: each prompt's posterior Beta(1 + s, 1 + G0 - s), its
    marginal hit utilities u(l) = B(a + 1, b + l) / B(a, b) through scipy's beta function (floats), and
    the `extra` largest of all prompts' marginals (u falls with l, so the top ones are the greedy's). The
    cases have no tie at the cut, so rounding cannot decide them. One probe first: there a wrong posterior
    gives finite utilities and a wrong allocation rather than a division by zero."""
    from scipy.special import beta

    from pods_bench.allocation.hora import allocate

    def reference(successes: list[int], probes: int, extra: int) -> list[int]:
        marginals = sorted(
            (
                (beta(1 + s + 1, 1 + probes - s + extra_so_far) / beta(1 + s, 1 + probes - s), i)
                for i, s in enumerate(successes)
                for extra_so_far in range(extra)
            ),
            reverse=True,
        )
        if extra < len(marginals):
            assert marginals[extra - 1][0] - marginals[extra][0] > 1e-9  # no tie at the cut
        counts = [0] * len(successes)
        for _, i in marginals[:extra]:
            counts[i] += 1
        return counts

    cases = [
        ([0, 1], 1, 5),  # Beta(1, 2), Beta(2, 1): 2/3, 1/3, 1/6, 1/6, 1/10 -> (3, 2)
        ([0, 2, 4], 4, 1),  # the one extra rollout to the likeliest-right prompt: utility 5/6
        ([0, 2, 4], 4, 12),
        ([1, 3, 0, 5], 5, 10),
        ([2, 1, 0], 2, 9),
        ([3], 3, 4),
    ]
    expected = {(tuple(s), p, e): reference(s, p, e) for s, p, e in cases}
    assert expected[((0, 1), 1, 5)] == [3, 2] and expected[((0, 2, 4), 4, 1)] == [0, 0, 1]  # by hand, above
    for successes, probes, extra in cases:
        assert allocate(successes, probes, extra) == expected[(tuple(successes), probes, extra)], (
            successes,
            probes,
            extra,
        )


# --- every setting's bounds: the edge accepted, one step past it a one-line error naming the key ----------


def _settings_cases():
    from pods_bench.allocation.dynamic_sampling import DynamicSamplingConfig
    from pods_bench.allocation.greso import GresoConfig
    from pods_bench.allocation.pilot_commit import PilotCommitConfig
    from pods_bench.allocation.reward_variance_filter import RewardVarianceFilterConfig

    key = "config key allocation."
    rounds = lambda s: f"{key}{s}.max_rounds must be >= 0 (0: no limit)"
    window = key + "pilot_commit: the pass window [pass_low, 1 - pass_high_margin] must lie in [0, 1] and not be empty"
    cases = [
        (DynamicSamplingConfig, {"max_rounds": 0, "prompts_per_round": 1}, None),
        (DynamicSamplingConfig, {"max_rounds": -1}, rounds("dynamic_sampling")),
        (DynamicSamplingConfig, {"prompts_per_round": 0}, f"{key}dynamic_sampling.prompts_per_round must be >= 1 "
         "(or null: 3 x prompts_per_step)"),
        (GresoConfig, {"max_rounds": -1}, rounds("greso")),
        (GresoConfig, {"max_rounds": 0, "target_zero_variance": 0, "p_step": 0, "prompts_per_round": 1,
                       "min_prompts_per_round": 1}, None),
        (GresoConfig, {"p_min": 1, "p_max": 1, "p_easy": 1, "p_hard": 1, "skip_floor": 1}, None),
        (GresoConfig, {"p_min": 0.5, "p_max": 0.5}, None),  # p_min = p_max: p never moves
        (GresoConfig, {"p_min": 0.6, "p_max": 0.5}, f"{key}greso.p_min must be <= p_max"),
        (GresoConfig, {"target_zero_variance": 1}, f"{key}greso.target_zero_variance must be in [0, 1)"),
        (GresoConfig, {"target_zero_variance": -0.1}, f"{key}greso.target_zero_variance must be in [0, 1)"),
        (GresoConfig, {"p_step": -0.01}, f"{key}greso.p_step must be >= 0"),
        (PilotCommitConfig, {"max_rounds": 0, "pilot_prompts": 1, "pilot_rollouts": 1, "max_off_steps": 0}, None),
        (PilotCommitConfig, {"max_rounds": -1}, rounds("pilot_commit")),
        (PilotCommitConfig, {"pilot_prompts": 0}, f"{key}pilot_commit.pilot_prompts must be >= 1 (or null: 3 x "
         "prompts_per_step)"),
        (PilotCommitConfig, {"pilot_rollouts": 0}, f"{key}pilot_commit.pilot_rollouts must be >= 1 (or null: "
         "selection.n / 4)"),
        (PilotCommitConfig, {"max_off_steps": -1}, f"{key}pilot_commit.max_off_steps must be >= 0"),
        # the window may be one point, or all of [0, 1]
        (PilotCommitConfig, {"pass_low": 0.75, "pass_high_margin": 0.25}, None),
        (PilotCommitConfig, {"pass_low": 0, "pass_high_margin": 0}, None),
        (PilotCommitConfig, {"pass_low": 0.875, "pass_high_margin": 0.25}, window + ", got [0.875, 0.75]"),
        (PilotCommitConfig, {"pass_low": -0.125}, window + ", got [-0.125, 0.75]"),
        (PilotCommitConfig, {"pass_low": 0.5, "pass_high_margin": -0.25}, window + ", got [0.5, 1.25]"),
        (PilotCommitConfig, {"solve_threshold": None}, None),
        (PilotCommitConfig, {"solve_threshold": 1}, None),
        (PilotCommitConfig, {"solve_threshold": 0}, f"{key}pilot_commit.solve_threshold must be in (0, 1] (or null: "
         "no eviction)"),
        (PilotCommitConfig, {"solve_threshold": 1.5}, f"{key}pilot_commit.solve_threshold must be in (0, 1] (or null: "
         "no eviction)"),
        (VigorConfig, {"initial_rollouts": 1, "keep_share": 1, "growth": 1, "rounds": 1}, None),
        (VigorConfig, {"initial_rollouts": 0}, f"{key}vigor.initial_rollouts must be >= 1"),
        (VigorConfig, {"keep_share": 1.5}, f"{key}vigor.keep_share must be in (0, 1]"),
        (VigorConfig, {"growth": 0}, f"{key}vigor.growth must be >= 1"),
        (VigorConfig, {"rounds": 0}, f"{key}vigor.rounds must be >= 1"),
        (RewardVarianceFilterConfig, {"value": 1}, None),
        (RewardVarianceFilterConfig, {"value": 0}, f"{key}reward_variance_filter.value must be in (0, 1], got 0"),
    ]  # fmt: skip
    for name in ("p_easy", "p_hard", "p_min", "p_max", "skip_floor"):
        bounds = {"p_min": 0.01} if name == "p_min" else {}
        cases.append((GresoConfig, {**bounds, name: 0}, f"{key}greso.{name} must be in (0, 1]"))
        cases.append((GresoConfig, {name: 1.01}, f"{key}greso.{name} must be in (0, 1]"))
    for name in ("prompts_per_round", "min_prompts_per_round"):
        cases.append((GresoConfig, {name: 0}, f"{key}greso.{name} must be >= 1 (or null)"))
    return cases


@pytest.mark.parametrize("settings, values, message", _settings_cases())
def test_each_allocation_setting_accepts_its_edge_and_names_itself_past_it(settings, values, message):
    if message is None:
        assert all(getattr(settings(**values), k) == v for k, v in values.items())
    else:
        with pytest.raises(PodsBenchError) as error:
            settings(**values)
        assert str(error.value) == message


def test_vigor_keeping_a_quarter_grows_the_two_earliest_mixed_prompts():
    # P = 8, m0 = 2, alpha 0.25, gamma 4, T = 2: 8 x 2 + ceil(0.25 x 8) = 2 x 8 = 32 = 8 x 4 rollouts.
    # Three prompts are mixed after round 1 (variance 0.25 each): the two drawn first stay active
    # (keeping 1 - alpha = 0.75 would keep 6)
    order = stream_order()[:8]
    rates = dict.fromkeys(range(NUM_PROMPTS), 0.0) | {order[i]: 0.5 for i in (1, 4, 6)}
    cfg = make_cfg("vigor", n=4, m=4, P=8, initial_rollouts=2, keep_share=0.25, growth=4, rounds=2)
    sampler = ScriptedSampler(cfg, rates)
    batch, stats = make_allocator(cfg, NUM_PROMPTS).collect(sampler)
    assert sampler.calls_made == [(order, 2), ([order[1], order[4]], 8)]
    assert batch.sizes == [2, 10, 2, 2, 10, 2, 2, 2]
    assert stats == {"num_gen_batches": 2, "groups_sampled": 10, "group_size_min": 2, "group_size_max": 10}
