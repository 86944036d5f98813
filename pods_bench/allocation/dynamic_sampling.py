"""DAPO's dynamic sampling, as verl's recipe runs it (volcengine/verl@246cac4,
recipe/dapo/dapo_ray_trainer.py:L130-L409; run_dapo_qwen2.5_32b.sh:L25-L29 for the defaults).

Per step, in rounds: draw `prompts_per_round` new prompts (default 3 x P), sample n rollouts each,
drop the groups whose n rewards are all equal (their GRPO advantages are all 0), and append the rest
until P groups are kept. The earliest kept groups train (a prefix, L286-L288); the surplus of the
last round is discarded and its prompts are consumed (not seen again this epoch). After
`max_rounds` rounds without P groups verl raises (L274-L284); here that is `when_short`. No state
is kept across steps.

`refill: shortfall` (not in DAPO) sizes the rounds to the batch instead: the first round draws P
prompts, each later one the shortfall scaled by the last round's share of informative groups,
ceil(missing / (1 - zero_share)), between `missing` and `prompts_per_round`. A fixed 3P round draws
three batches' worth of prompts even when one more group is missing; the surplus it discards is
most of the waste on the rollouts axis (docs/allocation.md).

`metric` decides what must differ within a group: "correct" (verl's filter_groups.metric acc, as the
DAPO recipe sets it) or "reward" (the trained reward: with format shaping an all-wrong group can
still differ in its format terms, and so still have an advantage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pods_bench.allocation.base import (
    ALLOCATION_STRATEGIES,
    AllocationStrategy,
    RoundsConfig,
    check_not_exhausted,
    require,
    short_batch,
)
from pods_bench.sampling import Graded, Groups, RolloutSampler


@dataclass
class DynamicSamplingConfig(RoundsConfig):
    """DAPO's dynamic sampling (allocation.strategy: dynamic_sampling)."""

    prompts_per_round: int | None = None  # None: 3 x prompts_per_step (the DAPO recipe's gen_prompt_bsz)
    # what must differ within a group for it to train: "correct" (verl's filter_groups.metric acc, the
    # DAPO recipe) or "reward" (the trained reward: with format shaping an all-wrong group can differ)
    metric: Literal["correct", "reward"] = "correct"
    # "fixed": every round draws prompts_per_round (DAPO); "shortfall": P first, then the shortfall over
    # the last round's informative share, at most prompts_per_round
    refill: Literal["fixed", "shortfall"] = "fixed"

    def __post_init__(self):
        self._check("dynamic_sampling")
        require(
            self.prompts_per_round is None or self.prompts_per_round >= 1,
            "config key allocation.dynamic_sampling.prompts_per_round must be >= 1 (or null: 3 x prompts_per_step)",
        )


@ALLOCATION_STRATEGIES.register("dynamic_sampling", settings=DynamicSamplingConfig)
class DynamicSampling(AllocationStrategy):
    """Refill rounds until P informative groups; subclasses choose the round's prompts (GRESO)."""

    # what collect() logs after the step record (docs/results-format.md)
    counters = ("num_gen_batches", "groups_sampled", "groups_discarded_zero_std", "groups_discarded_surplus")
    example_settings = {"when_short": "train", "max_rounds": 1}

    name = "dynamic_sampling"

    def round_size(self, round_index: int, missing: int, zero_share: float | None) -> int:
        """Prompts to roll out in round `round_index` (0-based), `missing` groups short, after a round
        whose share of all-equal groups was `zero_share` (None before the first)."""
        P = self.shape.prompts_per_step
        largest = self.settings.prompts_per_round or 3 * P
        if self.settings.refill == "fixed":
            return largest
        if round_index == 0:
            return min(P, largest)
        informative = 1 - zero_share
        wanted = largest if informative <= 0 else math.ceil(missing / informative)
        return min(max(wanted, missing), largest)

    def candidates(self, sampler: RolloutSampler, count: int, round_index: int) -> tuple[list[int], int]:
        """(prompts to roll out, prompts drawn in all): here the next `count` prompts."""
        return sampler.draw(count), count

    def observe(self, sampler: RolloutSampler, everyone: list[Graded]) -> None:
        """Called with every group a round rolled out (before any is dropped)."""

    def finish_step(self, sampler: RolloutSampler, stats: dict) -> None:
        """Called once the step's batch is complete."""

    def collect(self, sampler: RolloutSampler) -> tuple[Groups, dict]:
        want, n = self.shape.prompts_per_step, self.shape.n
        parts, have, drawn, zero_share = [], 0, 0, None
        # why groups are discarded, as verl's DAPO recipe counts them: all-equal (zero std of the
        # filter's metric), or informative but beyond the P the batch needs (the last round's surplus)
        stats = {
            "num_gen_batches": 0,
            "groups_sampled": 0,
            "groups_discarded_zero_std": 0,
            "groups_discarded_surplus": 0,
        }
        while True:
            prompts, count = self.candidates(
                sampler, self.round_size(stats["num_gen_batches"], want - have, zero_share), stats["num_gen_batches"]
            )
            drawn += count
            local, everyone = sampler.sample(prompts, n)
            stats["num_gen_batches"] += 1
            stats["groups_sampled"] += len(everyone)
            self.observe(sampler, everyone)
            informative = [g for g in everyone if g.differs(self.settings.metric)]
            zero_share = 1 - len(informative) / len(everyone) if everyone else 1.0
            kept = informative[: want - have]  # the earliest kept groups train; the surplus is dropped
            parts.append(local.rows([g.row for g in kept if g.owner == sampler.rank]))
            have += len(kept)
            stats["groups_discarded_zero_std"] += len(everyone) - len(informative)
            stats["groups_discarded_surplus"] += len(informative) - len(kept)
            if have >= want:
                break
            why = (
                "every other group's rewards were all equal"
                if self.settings.metric == "reward"
                else "every other group was all correct or all wrong"
            )
            check_not_exhausted(self.settings, self.name, drawn, self.num_prompts, have, want, why)
            if not short_batch(self.name, self.settings, have, want, stats["num_gen_batches"], why):
                break
        self.finish_step(sampler, stats)
        return Groups.concat(parts), stats
