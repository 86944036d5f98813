"""The paper's allocation: every step the next P prompts of the stream, n rollouts each."""

from __future__ import annotations

from pods_bench.allocation.base import ALLOCATION_STRATEGIES, AllocationStrategy
from pods_bench.sampling import Groups, RolloutSampler


@ALLOCATION_STRATEGIES.register("uniform")
class Uniform(AllocationStrategy):
    """P prompts x G groups (selection.groups_per_prompt) x n rollouts, one sampling call."""

    # what collect() logs after the step record (docs/results-format.md)
    counters = ("num_gen_batches", "groups_sampled")

    groups_per_prompt = True

    def collect(self, sampler: RolloutSampler) -> tuple[Groups, dict]:
        s = self.shape
        groups, everyone = sampler.sample(sampler.draw(s.prompts_per_step), s.n, repeats=s.groups_per_prompt)
        return groups, {"num_gen_batches": 1, "groups_sampled": len(everyone)}
