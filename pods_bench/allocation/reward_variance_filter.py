"""RAGEN-2's reward-variance filter (RAGEN-AI/RAGEN@4ec2574, ragen/trainer/rollout_filter.py:L68-L130,
`RolloutFilter._select_top_groups`, with `RewardRolloutFilter`'s default metric `reward_variance`).

Per step: the next P prompts, n rollouts each, as `uniform`; then rank the P groups by the std of
their n rewards and train only the top ones. RAGEN's recommended setting ("top-p linear": strategy
top_p, top_p_prob_mode linear, value 0.9, include_zero false) keeps the smallest set of highest-std
groups whose stds sum to at least value x the sum over all groups (minus its selection_eps 0.01);
zero-std groups are never kept. `keep: top_k` keeps the top int(value x P) groups (at least one),
zero-std groups among them unless `include_zero` is false, as RAGEN's top_k.

No refill: the batch is smaller than P on steps whose groups are uneven. The std is of the total
reward, any real values (format shaping, partial credit); with 0/1 rewards it is sqrt(p (1 - p)) of
the group's pass rate p, so the filter prefers groups near p = 0.5. Ties in std keep the earlier
group in draw order (RAGEN's torch.sort is not stable; here the order is fixed so that every process
and a resumed run agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pods_bench.allocation.base import ALLOCATION_STRATEGIES, AllocationStrategy, require
from pods_bench.sampling import Groups, RolloutSampler

SELECTION_EPS = 0.01  # RAGEN's selection_eps: the top-p threshold is value x total - eps


@dataclass
class RewardVarianceFilterConfig:
    """RAGEN-2's filter (allocation.strategy: reward_variance_filter); defaults: its top-p linear preset."""

    keep: Literal["top_p", "top_k"] = "top_p"  # RAGEN's rollout_filter_strategy
    value: float = 0.9  # top_p: share of the summed std to keep; top_k: share of the P groups
    include_zero: bool = False  # keep zero-std groups if ranked in (top_p never ranks them in)

    def __post_init__(self):
        require(
            0 < self.value <= 1,
            f"config key allocation.reward_variance_filter.value must be in (0, 1], got {self.value}",
        )


def kept_groups(stds: list[float], keep: str, value: float, include_zero: bool) -> list[int]:
    """Indices (in draw order) of the groups the filter keeps, given each group's reward std."""
    candidates = [i for i, s in enumerate(stds) if include_zero or s > 0]
    ranked = sorted(candidates, key=lambda i: -stds[i])  # stable: ties keep draw order
    if keep == "top_k":
        chosen = ranked[: min(max(int(value * len(stds)), 1), len(ranked))]
    elif value >= 1 and include_zero:  # RAGEN: top_p 1.0 keeps everything
        chosen = ranked
    else:
        threshold, total, chosen = value * sum(stds[i] for i in candidates) - SELECTION_EPS, 0.0, []
        for i in ranked:
            if total >= threshold or stds[i] <= 0:
                break
            total += stds[i]
            chosen.append(i)
    return sorted(chosen)


@ALLOCATION_STRATEGIES.register("reward_variance_filter", settings=RewardVarianceFilterConfig)
class RewardVarianceFilter(AllocationStrategy):
    """The next P prompts, n rollouts each; train on the groups whose rewards vary most."""

    # what collect() logs after the step record (docs/results-format.md)
    counters = ("num_gen_batches", "groups_sampled", "groups_discarded_zero_std", "groups_discarded_low_std")

    name = "reward_variance_filter"

    def collect(self, sampler: RolloutSampler) -> tuple[Groups, dict]:
        c = self.settings
        local, everyone = sampler.sample(sampler.draw(self.shape.prompts_per_step), self.shape.n)
        stds = [float(np.std(g.rewards)) for g in everyone]
        kept = kept_groups(stds, c.keep, c.value, c.include_zero)
        dropped = set(range(len(everyone))) - set(kept)
        zero = sum(1 for i in dropped if stds[i] == 0)
        stats = {
            "num_gen_batches": 1,
            "groups_sampled": len(everyone),
            "groups_discarded_zero_std": zero,
            "groups_discarded_low_std": len(dropped) - zero,
        }
        return local.rows([everyone[i].row for i in kept if everyone[i].owner == sampler.rank]), stats
