"""HORA: hit-utility optimal rollout allocation within a step (arXiv 2605.07114), built from the
method's summary in docs/allocation.md: the paper's full text and code were not at hand.

Per step, for the next P prompts:

  1. probe: G0 rollouts of each; s_i of prompt i's are correct
  2. posterior of its pass rate p_i:  Beta(1 + s_i, 1 + G0 - s_i)   (uniform prior)
  3. the remaining budget, P x selection.n - P x G0 rollouts (compute-matched to GRPO with n a
     prompt), one rollout at a time to the prompt of highest marginal hit utility
         u_i(l) = E[p_i (1 - p_i)^l] = B(a + 1, b + l) / B(a, b)      (a, b: the posterior's)
     where l is the extra rollouts prompt i has so far. u_i falls with l, so this greedy is the
     top (budget) of all prompts' marginal utilities.
  4. the extra rollouts, joined to the probe: every group trains, whatever its size.

Worked case (tests/test_allocation.py): G0 = 4, posteriors Beta(1, 5), Beta(3, 3), Beta(5, 1) and 12
extra rollouts give (6, 4, 2).

Choices of ours (labelled, not the paper's): equal utilities go to the prompt drawn first (the
utilities are compared as exact fractions, so equal ones are equal); the extra
rollouts of the prompts that get the same number are sampled in one call; correctness (not the
shaped reward) counts as a hit.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from fractions import Fraction

from pods_bench.allocation.base import ALLOCATION_STRATEGIES, AllocationStrategy, GrowingGroups, StepShape, require
from pods_bench.sampling import Groups, RolloutSampler


@dataclass
class HoraConfig:
    """HORA (allocation.strategy: hora)."""

    probe_rollouts: int = 4  # G0


def hit_utility(a: int, b: int, extra: int) -> Fraction:
    """E[p (1 - p)^extra] for p ~ Beta(a, b), a and b whole numbers (the posteriors' always are), as
    an exact fraction: B(a + 1, b + extra) / B(a, b) = a / (a + b) x prod_{j < extra} (b + j) / (a + b + 1 + j)
    (from B(x, y + 1) = B(x, y) y / (x + y)).

    Exact, not floating point: equal utilities must compare equal so that the documented tie rule (the
    prompt drawn first) decides between them. Through log-gamma, B(1, 3)'s third marginal and B(2, 2)'s
    third (both exactly 1/10) came out 0.0999...9 and 0.0999...98, and rounding gave the later prompt the
    rollout; a tolerance would instead call unequal utilities equal."""
    utility = Fraction(a, a + b)
    for j in range(extra):
        utility *= Fraction(b + j, a + b + 1 + j)
    return utility


def allocate(successes: list[int], probes: int, extra: int) -> list[int]:
    """Extra rollouts per prompt: `extra` of them, greedily by marginal hit utility under
    Beta(1 + s, 1 + probes - s), compared exactly; equal utilities to the earlier prompt."""
    given = [0] * len(successes)
    posterior = [(1 + s, 1 + probes - s) for s in successes]
    utility = [hit_utility(a, b, 0) for a, b in posterior]  # of each prompt's next extra rollout
    heap = [(-u, i) for i, u in enumerate(utility)]
    heapq.heapify(heap)
    for _ in range(extra if successes else 0):
        _, i = heapq.heappop(heap)
        a, b = posterior[i]
        utility[i] *= Fraction(b + given[i], a + b + 1 + given[i])  # hit_utility(a, b, given[i] + 1)
        given[i] += 1
        heapq.heappush(heap, (-utility[i], i))
    return given


@ALLOCATION_STRATEGIES.register("hora", settings=HoraConfig)
class Hora(AllocationStrategy):
    # what collect() logs after the step record (docs/results-format.md)
    counters = ("num_gen_batches", "groups_sampled", "group_size_min", "group_size_max")
    example_settings = {"probe_rollouts": 2}

    name = "hora"

    @classmethod
    def check_config(cls, settings: HoraConfig, shape: StepShape) -> None:
        g0, n = settings.probe_rollouts, shape.n
        require(
            1 <= g0 < n,
            f"config key allocation.hora.probe_rollouts must be in 1..selection.n - 1 = {n - 1} (the probe is "
            f"part of the n rollouts a prompt gets on average), got {g0}",
        )

    def collect(self, sampler: RolloutSampler) -> tuple[Groups, dict]:
        g0, n = self.settings.probe_rollouts, self.shape.n
        prompts = sampler.draw(self.shape.prompts_per_step)
        local, everyone = sampler.sample(prompts, g0)
        extra = allocate([round(sum(g.correct)) for g in everyone], g0, len(prompts) * (n - g0))
        groups = GrowingGroups(sampler, prompts, local, everyone)  # by slot: a draw can repeat a prompt
        stats = {"num_gen_batches": 1, "groups_sampled": len(everyone)}
        for k in sorted(set(extra) - {0}):
            chosen = [s for s, e in enumerate(extra) if e == k]
            groups.add(sampler, chosen, k)
            stats["num_gen_batches"] += 1
            stats["groups_sampled"] += len(chosen)
        sizes = [g0 + e for e in extra]
        stats.update(group_size_min=min(sizes), group_size_max=max(sizes))
        return groups.batch(), stats
