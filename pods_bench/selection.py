"""Down-sampling rules: which m of the n rollouts of each prompt to train on.

Every rule maps rewards (P prompts, n rollouts) to indices (P, m) into dim 1, vectorised over all
prompts at once, and registers itself in `SELECTION_RULES` (plugins.Registry); a rule with settings
of its own registers their dataclass too, and receives them as `settings` (config section
selection.<rule>). `select(rule, rewards, m)` validates the input and dispatches;
`group_advantages` normalises the kept rewards as GRPO does.

  max_variance       PODS: the m rewards with the largest sample variance (exact, O(n log m) per prompt)
  max_reward         the m highest rewards
  random             m rollouts uniformly at random (a torch.Generator makes it reproducible)
  all                vanilla GRPO: train on every rollout (m must equal n)
  max_abs_advantage  the m rewards farthest from the mean of all n (CPPO-style pruning)

`nonuniform_groups(rewards)` is DAPO's dynamic-sampling filter (drop prompts whose n rewards are all
equal: they carry no GRPO signal); its mask combines with any rule: `select(rule, rewards[mask], m)`.

`choose(rewards, selection_config, generator)` is steps 4-5 of a training step in one place: the
optional filter, the rule (or CPPO's batch-level pruning, `scope: batch`) and the advantages (over
the kept m, or over all n with `advantage_over: all`).

Tie-breaking is deterministic and device-independent: equal rewards are ordered by rollout index,
exactly as a stable sort orders them, so the same rewards always give the same indices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pods_bench.errors import PodsBenchError
from pods_bench.plugins import Registry
from pods_bench.selection_config import SelectionConfig

# rule(rewards (P, n) float, m, generator) -> indices (P, m) int64; a rule registered with settings
# is called with its settings as a fourth argument, `settings`
SelectionRule = Callable[..., Tensor]
SELECTION_RULES = Registry("selection rule", "selection.rule")

# Split scores closer than this (relative to m^2 * range^2, their natural scale) count as equal.
# float64 prefix-sum error is ~1e-13 of that scale even for m = 1024; float32 input spacing
# keeps genuinely different variances further apart than this in practice.
_SPLIT_SCORE_RTOL = 1e-10


def _order_keys(rewards: Tensor) -> Tensor:
    """Unique int64 keys ordered exactly like (float32 reward, rollout index): `topk` on them
    (O(n log m)) picks what a stable sort (O(n log n)) would, on any device.

    A float32 widened to float64 leaves the 29 low mantissa bits zero: the index goes there
    (n < 2^29). Flipping the magnitude bits of negative numbers makes signed-int order equal float
    order (the usual radix-sort trick). + 0.0 turns -0.0 into +0.0 so that all zeros tie.
    In place on one fresh buffer: at n = 1024 fresh intermediates doubled the cost.
    """
    wide = rewards.float().double()  # always a copy
    wide += 0.0
    keys = wide.view(torch.int64)
    keys ^= (keys >> 63).bitwise_and_((1 << 63) - (1 << 29))  # negative: flip bits 29..62
    keys |= torch.arange(rewards.shape[1], device=rewards.device)
    return keys


@SELECTION_RULES.register("max_variance")
def max_variance(rewards: Tensor, m: int, generator: torch.Generator | None = None) -> Tensor:
    """PODS max-variance down-sampling, exact.

    Structure theorem (PODS paper, Xu et al. 2025): some optimal subset is the k largest plus the
    m - k smallest rewards, k in 0..m. So take the m lowest and m highest rewards of each row and
    score all m + 1 splits with prefix sums, for all prompts at once (no loops, no host sync).
    Rewards are compared as float32 (float64 input is rounded), equal rewards in order of rollout
    index (as a stable ascending sort would order them). Ties between splits (variances equal up to
    `_SPLIT_SCORE_RTOL`) go to the fewest top rewards (smallest k). Indices come out in ascending
    reward order. With m = 1 every split has variance 0 and the lowest reward is kept.
    """
    keys = _order_keys(rewards)
    low_idx = keys.topk(m, dim=1, largest=False).indices  # m lowest, ascending
    high_idx = keys.topk(m, dim=1).indices.flip(1)  # m highest, ascending
    # Shift by the mid-range (variance is shift-invariant) and score in float64 so that S^2 and
    # m*Q do not cancel catastrophically.
    low = rewards.gather(1, low_idx).float().double()
    high = rewards.gather(1, high_idx).float().double()
    mid = (low[:, :1] + high[:, -1:]) / 2
    low, high = low - mid, high - mid
    # Split j = m - k keeps low[:, :j] and high[:, j:] (disjoint since j + k = m <= n):
    #   S(j) = sum(high) + sum_{i<j} (low_i - high_i),   Q(j) likewise with squares.
    prefix_sums = lambda x: F.pad(x.cumsum(1), (1, 0))  # [0, x_0, x_0 + x_1, ...]
    S = high.sum(1, keepdim=True) + prefix_sums(low - high)  # (P, m+1)
    Q = high.square().sum(1, keepdim=True) + prefix_sums(low.square() - high.square())
    score = m * Q - S * S  # = m^2 * population variance of the kept m; same argmax as unbiased
    tol = _SPLIT_SCORE_RTOL * m * m * (high[:, -1:] - low[:, :1]) ** 2
    near_best = score >= score.amax(1, keepdim=True) - tol
    j = (near_best * torch.arange(m + 1, device=rewards.device)).amax(1, keepdim=True)  # largest j, smallest k
    # Output slot t (0-based) holds the (t+1)-th lowest if t < j, else the (m-t)-th highest.
    slot = torch.arange(m, device=rewards.device)
    return torch.where(slot < j, low_idx, high_idx)


@SELECTION_RULES.register("max_reward")
def max_reward(rewards: Tensor, m: int, generator: torch.Generator | None = None) -> Tensor:
    """The m highest rewards (descending); equal rewards go to the lower rollout index."""
    return torch.sort(rewards, dim=1, descending=True, stable=True).indices[:, :m]


@SELECTION_RULES.register("random")
def random_subset(rewards: Tensor, m: int, generator: torch.Generator | None = None) -> Tensor:
    """m distinct rollouts uniformly at random: the first m of a random permutation per row.
    Reproducible given a seeded `generator`; without one, torch's global RNG is used."""
    P, n = rewards.shape
    device = generator.device if generator is not None else rewards.device
    keys = torch.rand(P, n, generator=generator, device=device)  # i.i.d. keys -> uniform permutation
    return keys.argsort(dim=1)[:, :m].to(rewards.device)


@SELECTION_RULES.register("all")
def all_rollouts(rewards: Tensor, m: int, generator: torch.Generator | None = None) -> Tensor:
    """Vanilla GRPO: every rollout, in order. m must equal n."""
    P, n = rewards.shape
    if m != n:
        raise PodsBenchError(f"selection rule 'all' keeps every rollout: m must equal n={n}, got m={m}")
    return torch.arange(n, device=rewards.device).repeat(P, 1)


@SELECTION_RULES.register("max_abs_advantage")
def max_abs_advantage(rewards: Tensor, m: int, generator: torch.Generator | None = None) -> Tensor:
    """The m rewards with the largest |r - mean of all n| (CPPO); equal distances by rollout index."""
    r = rewards.double()  # float64 so that rewards symmetric about the mean tie exactly more often
    distance = (r - r.mean(1, keepdim=True)).abs()  # |A_i| up to the common 1/std factor
    return torch.sort(distance, dim=1, descending=True, stable=True).indices[:, :m]


def _check_rewards(rewards: Tensor, what: str = "rewards") -> Tensor:
    """2-D, real and finite (one reduction and one host sync); integers become float."""
    if not isinstance(rewards, Tensor):
        raise PodsBenchError(f"{what} must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.ndim != 2:
        raise PodsBenchError(f"{what} must be 2-D (prompts, rollouts), got shape {tuple(rewards.shape)}")
    if rewards.is_complex():
        raise PodsBenchError(f"{what} must be real, got dtype {rewards.dtype}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if rewards.numel() and not bool(torch.isfinite(torch.stack(rewards.aminmax())).all()):  # NaN propagates
        raise PodsBenchError(f"{what} contain NaN or infinite values")
    return rewards


def select(
    rule: str, rewards: Tensor, m: int, generator: torch.Generator | None = None, settings: object | None = None
) -> Tensor:
    """Indices (P, m) of the rollouts to train on, chosen by `rule` from rewards (P, n); a rule with
    settings gets `settings` (None: its settings dataclass's defaults).

    Requires 1 <= m <= n; so variance rules with m >= 2 always see n >= 2 (with m = 1 any single
    rollout has variance 0 and is a valid answer).
    """
    if rule not in SELECTION_RULES:
        raise PodsBenchError(f"unknown selection rule {rule!r}; choose from {', '.join(SELECTION_RULES)}")
    rewards = _check_rewards(rewards)
    n = rewards.shape[1]
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= n:
        raise PodsBenchError(f"m (rollouts kept per prompt) must be an integer in 1..n={n}, got {m!r}")
    settings_class = SELECTION_RULES.settings().get(rule)
    if settings_class is None:
        return SELECTION_RULES[rule](rewards, m, generator)
    return SELECTION_RULES[rule](rewards, m, generator, settings if settings is not None else settings_class())


def nonuniform_groups(rewards: Tensor) -> Tensor:
    """DAPO dynamic-sampling filter: (P,) bool, False where all n rewards of a prompt are equal
    (zero GRPO advantage, hence zero gradient)."""
    rewards = _check_rewards(rewards)
    return rewards.amax(1) > rewards.amin(1)


def group_advantages(kept_rewards: Tensor, scale_by_std: bool = True, eps: float = 1e-4) -> Tensor:
    """GRPO advantages over the kept m of each prompt: A_i = (r_i - mean_m) / (std_m + eps).

    std is the unbiased sample std (Bessel-corrected, like torch.std), as in the paper's official
    code. Rows whose kept rewards are all equal (including m = 1) get exactly 0, never NaN:
    rounding in the mean could otherwise leave ~1e-8 / eps residues, and the unbiased std of one
    value is undefined.
    """
    r = _check_rewards(kept_rewards, "kept rewards")
    if r.shape[1] == 0:
        raise PodsBenchError("kept rewards must have at least one rollout per prompt")
    uniform = r.amax(1, keepdim=True) == r.amin(1, keepdim=True)
    m = r.shape[1]
    advantage = r - r.mean(1, keepdim=True)  # r_i - mean_m
    if scale_by_std and m > 1:
        std = (advantage.square().sum(1, keepdim=True) / (m - 1)).sqrt()  # sqrt(sum (r_i - mean)^2 / (m - 1))
        advantage = advantage / (std + eps)
    return torch.where(uniform, torch.zeros_like(advantage), advantage)


# --- steps 4-5 of a training step: which rollouts train, with which advantages ---------------------


@dataclass
class Choice:
    """The rollouts a step trains on: rollout `cols[i]` of group `groups[rows[i]]`, with advantage
    `advantages[i]` and reward `rewards[i]`; `informative` marks the groups whose n rewards differ."""

    groups: list[int]  # the groups that train (all, or those the DAPO filter keeps), in batch order
    rows: Tensor  # (kept,) index into `groups`
    cols: Tensor  # (kept,) the rollout within its group
    advantages: Tensor  # (kept,)
    rewards: Tensor  # (kept,)
    informative: Tensor  # (all groups,) bool


def kept_per_group(s: SelectionConfig, size: int) -> int:
    """How many of a group's `size` rollouts train: all of them under rule "all" (whatever the
    group's size), else m, or the whole group when it has no more than m."""
    return size if s.rule == "all" else min(s.m, size)


def choose(rewards: Tensor | list[Tensor], s: SelectionConfig, generator: torch.Generator | None = None) -> Choice:
    """Steps 4-5 for a batch of groups: rewards (groups, n), or one 1-D tensor per group where groups
    differ in size (VIGOR, HORA). Groups of one size go through `choose_uniform` together, in order
    of size; a group keeps `kept_per_group` of its rollouts, its advantages over those (the unbiased
    std of the group's kept rewards; a group of one gets 0)."""
    if isinstance(rewards, Tensor):
        return choose_uniform(rewards, s, s.m, generator)
    sizes = [len(r) for r in rewards]
    if len(set(sizes)) <= 1:  # one size: exactly the (groups, n) path
        stacked = torch.stack(rewards) if rewards else torch.zeros(0, s.n, dtype=torch.float64)
        return choose_uniform(stacked, s, kept_per_group(s, stacked.shape[1]), generator)
    if s.scope == "batch":
        raise PodsBenchError(
            "selection.scope: 'batch' (CPPO's batch-level pruning keeps groups x m rollouts) needs groups of one "
            f"size; this step's groups have {min(sizes)}-{max(sizes)} rollouts"
        )
    informative = torch.zeros(len(sizes), dtype=torch.bool)
    kept = []  # (group in the batch, rollout, advantage, reward)
    for size in sorted(set(sizes)):
        index = [g for g, k in enumerate(sizes) if k == size]
        c = choose_uniform(torch.stack([rewards[g] for g in index]), s, kept_per_group(s, size), generator)
        informative[index] = c.informative
        rows = [index[c.groups[r]] for r in c.rows.tolist()]
        kept += zip(rows, c.cols.tolist(), c.advantages.tolist(), c.rewards.tolist())
    kept.sort(key=lambda x: x[0])  # batch order; stable, so each group's rollouts keep the rule's order
    groups = sorted({g for g, *_ in kept})
    row_of = {g: i for i, g in enumerate(groups)}
    as_tensor = lambda i, dtype: torch.tensor([x[i] for x in kept], dtype=dtype)
    return Choice(
        groups,
        torch.tensor([row_of[g] for g, *_ in kept], dtype=torch.long),
        as_tensor(1, torch.long),
        as_tensor(2, torch.float64),
        as_tensor(3, torch.float64),
        informative,
    )


def choose_uniform(rewards: Tensor, s: SelectionConfig, m: int, generator: torch.Generator | None = None) -> Choice:
    """Optionally drop all-equal groups (DAPO's filter, without refill), keep m of each group's n by
    the selection rule and normalise advantages over the kept m:  A_i = (r_i - mean_m) / (std_m + eps);
    or (CPPO, advantage_over: all) over all n, kept as they are for the kept rollouts, optionally
    choosing the groups x m kept over the whole batch (scope: batch)."""
    informative = nonuniform_groups(rewards)
    keep = informative if s.filter_uniform_groups else torch.ones(len(rewards), dtype=torch.bool)
    groups = keep.nonzero().squeeze(1).tolist()
    if not groups:
        empty = torch.zeros(0, dtype=torch.long)
        return Choice(
            [], empty, empty, torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64), informative
        )
    kept = rewards[keep]
    over_all = group_advantages(kept, scale_by_std=s.scale_advantage_by_std) if s.advantage_over == "all" else None
    if s.scope == "batch":
        # CPPO's pruning (lzhxmu/CPPO@52faeb3, cppo_verl/recipe/cppo/src/cppo_ray_trainer.py:L310-L328):
        # the groups x m rollouts of the batch with the largest |A|, in batch order
        flat = torch.sort(over_all.abs().flatten(), descending=True, stable=True).indices[: len(groups) * m]
        flat = flat.sort().values
        rows, cols = flat // kept.shape[1], flat % kept.shape[1]
        advantages = over_all[rows, cols]
    else:
        chosen = select(s.rule, kept, m, generator, SELECTION_RULES.typed_settings(s))  # (kept groups, m)
        rows, cols = torch.arange(len(groups)).repeat_interleave(m), chosen.flatten()
        advantages = (
            over_all[rows, cols]
            if over_all is not None
            else group_advantages(kept.gather(1, chosen), scale_by_std=s.scale_advantage_by_std).flatten()
        )
    return Choice(groups, rows, cols, advantages, kept[rows, cols], informative)
