"""VIGOR: variance-guided progressive allocation within a step (arXiv 2607.22002), built from the
method's summary in docs/allocation.md: the paper's full text and code were not at hand.

Per step, for the next P prompts, in T rounds:

    round 1      m0 rollouts of each of the P prompts (all active)
    round t > 1  the top alpha share of the active prompts by the variance of all their rewards so
                 far stay active, each gets m0 * gamma^(t-1) more rollouts
    every group trains, whatever its size (groups of different sizes, pods_bench/selection.py)

With P = 8, m0 = 2, alpha = 0.5, gamma = 2, T = 4 the active prompts are 8, 4, 2, 1 and the groups
end with 2, 2, 2, 2, 6, 6, 14 and 30 rollouts: 64 in all, 8 a prompt. The schedule must spend the
step's budget of P x selection.n rollouts exactly (compute-matched to GRPO with n rollouts a prompt),
which `check_config` holds it to.

Choices of ours (labelled, not the paper's): the active count of the next round is
ceil(alpha x active); variance is the population variance of the prompt's rewards so far; equal
variances go to the prompt drawn first; each slot of the draw is a group of its own (a draw that
crosses an epoch boundary can hold one prompt twice). Later rounds sample a prompt on the process that holds its
earlier rollouts, so each group's rollouts stay together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pods_bench.allocation.base import ALLOCATION_STRATEGIES, AllocationStrategy, GrowingGroups, StepShape, require
from pods_bench.sampling import Groups, RolloutSampler


@dataclass
class VigorConfig:
    """VIGOR (allocation.strategy: vigor); the settings of the method's summary."""

    initial_rollouts: int = 2  # m0: rollouts of every prompt in round 1
    keep_share: float = 0.5  # alpha: share of the active prompts that stay active each round
    growth: int = 2  # gamma: each round gives the active prompts gamma times the previous round's rollouts
    rounds: int = 4  # T

    def __post_init__(self):
        require(self.initial_rollouts >= 1, "config key allocation.vigor.initial_rollouts must be >= 1")
        require(0 < self.keep_share <= 1, "config key allocation.vigor.keep_share must be in (0, 1]")
        require(self.growth >= 1, "config key allocation.vigor.growth must be >= 1")
        require(self.rounds >= 1, "config key allocation.vigor.rounds must be >= 1")

    def schedule(self, prompts: int) -> list[tuple[int, int]]:
        """(active prompts, rollouts each) of every round."""
        out, active = [], prompts
        for t in range(self.rounds):
            out.append((active, self.initial_rollouts * self.growth**t))
            active = max(1, math.ceil(self.keep_share * active))
        return out


@ALLOCATION_STRATEGIES.register("vigor", settings=VigorConfig)
class Vigor(AllocationStrategy):
    # what collect() logs after the step record (docs/results-format.md)
    counters = ("num_gen_batches", "groups_sampled", "group_size_min", "group_size_max")
    example_settings = {"rounds": 2}  # 4 prompts x 2 rollouts, then 2 x 4: the P x n = 16 of the budget

    name = "vigor"

    @classmethod
    def check_config(cls, settings: VigorConfig, shape: StepShape) -> None:
        v, P, n = settings, shape.prompts_per_step, shape.n
        plan = v.schedule(P)
        spent = sum(a * k for a, k in plan)
        require(
            spent == P * n,
            f"config key allocation.vigor: its rounds spend {spent} rollouts a step "
            f"({' + '.join(f'{a} x {k}' for a, k in plan)}), the budget is prompts_per_step x selection.n = "
            f"{P} x {n} = {P * n}; choose initial_rollouts, keep_share, growth and rounds that spend it "
            f"(e.g. selection.n = initial_rollouts x rounds with keep_share x growth = 1)",
        )

    def collect(self, sampler: RolloutSampler) -> tuple[Groups, dict]:
        prompts = sampler.draw(self.shape.prompts_per_step)
        plan = self.settings.schedule(len(prompts))
        local, everyone = sampler.sample(prompts, plan[0][1])
        # groups by slot (position in the draw): a draw across an epoch boundary can repeat a prompt
        groups = GrowingGroups(sampler, prompts, local, everyone)
        rewards = [list(g.rewards) for g in everyone]  # every process: every slot's rewards so far
        active = list(range(len(prompts)))
        stats = {"num_gen_batches": 1, "groups_sampled": len(everyone)}
        for count, k in plan[1:]:
            # the `count` active slots whose rewards so far vary most (ties: the one drawn first)
            active = sorted(sorted(active, key=lambda s: (-float(np.var(rewards[s])), s))[:count])
            for s, g in zip(active, groups.add(sampler, active, k)):
                rewards[s] += g.rewards
            stats["num_gen_batches"] += 1
            stats["groups_sampled"] += len(active)
        sizes = [len(r) for r in rewards]
        stats.update(group_size_min=min(sizes), group_size_max=max(sizes))
        return groups.batch(), stats
