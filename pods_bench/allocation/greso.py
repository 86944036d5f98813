"""GRESO: skip prompts before rollout when their history says the group will be all-correct or
all-wrong again (Infini-AI-Lab/GRESO@b277843, verl/trainer/ttis/presampling_selector.py and
verl/trainer/ppo/ray_trainer.py; defaults from train-scripts/*_greso.sh).

Per prompt, the streak z of its latest groups that were all correct (easy) or all wrong (hard),
recorded from every group rolled out, before any is dropped (ray_trainer.py:L1119-L1132). When a
prompt comes up, it is skipped (gone for this epoch) with probability

    1 - max(p^z, floor)          p = p_easy or p_hard, floor 0.01   (presampling_selector.py:L102-L147)

so a prompt without a streak is always rolled out. Rolled-out groups go through dynamic sampling
(groups whose rewards are all equal are dropped, refill rounds until P are kept; ttis.py:L24-L39).
After each step, from the second epoch on, p_easy / p_hard move by p_step towards the target share
of all-correct (target / 3) and all-wrong (2 target / 3) groups among those rolled out in the step:
a share at or above target lowers p (more skipping), below raises it, within [p_min, p_max]
(ray_trainer.py:L1199-L1219).

Differences from the code, on purpose: easy / hard are all-correct / all-wrong by correctness (the
code tests the group mean reward against 0.98 / 0.11, tuned to its {0, 0.1, 1} rewards and n = 8,
and measured the hard share as all-0.1 groups: with 0/1 rewards it would always be 0); skip draws
come from a generator seeded by (seed, step, round), so a resumed run replays them; a refill round
rolls out ceil(missing / (1 - zero-variance share) x 1.25) prompts within [min, max] as the code
does, but stops by `max_rounds` / `when_short` instead of its "last round" rule (which trains on a
short batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pods_bench.allocation.base import ALLOCATION_STRATEGIES, RoundsConfig, StepShape, require
from pods_bench.allocation.dynamic_sampling import DynamicSampling
from pods_bench.sampling import Graded, RolloutSampler


@dataclass
class GresoConfig(RoundsConfig):
    """GRESO's pre-rollout skipping (allocation.strategy: greso); defaults from its code and scripts."""

    p_easy: float = 0.5  # start values of the keep probabilities (data.p_easy / data.p_hard)
    p_hard: float = 0.5
    target_zero_variance: float = 0.25  # 1/3 of it aimed at all-correct groups, 2/3 at all-wrong
    p_min: float = 0.05  # bounds of p_easy / p_hard
    p_max: float = 0.95
    p_step: float = 0.01  # adaptation step per training step
    skip_floor: float = 0.01  # a prompt is kept with probability >= this, however long its streak
    prompts_per_round: int | None = None  # most prompts rolled out per round; None: 1.5 x prompts_per_step
    min_prompts_per_round: int | None = None  # fewest in a refill round; None: prompts_per_step / 4
    metric: Literal["correct", "reward"] = "reward"  # GRESO's refill drops groups whose rewards are all equal

    def __post_init__(self):
        self._check("greso")
        for key in ("p_easy", "p_hard", "p_min", "p_max", "skip_floor"):
            require(0 < getattr(self, key) <= 1, f"config key allocation.greso.{key} must be in (0, 1]")
        require(self.p_min <= self.p_max, "config key allocation.greso.p_min must be <= p_max")
        require(
            0 <= self.target_zero_variance < 1, "config key allocation.greso.target_zero_variance must be in [0, 1)"
        )
        require(self.p_step >= 0, "config key allocation.greso.p_step must be >= 0")
        for key in ("prompts_per_round", "min_prompts_per_round"):
            value = getattr(self, key)
            require(value is None or value >= 1, f"config key allocation.greso.{key} must be >= 1 (or null)")


@ALLOCATION_STRATEGIES.register("greso", settings=GresoConfig)
class Greso(DynamicSampling):
    # what collect() logs after the step record (docs/results-format.md)
    counters = (*DynamicSampling.counters, "prompts_skipped", "p_easy", "p_hard")
    example_settings = {"when_short": "train", "max_rounds": 1}

    name = "greso"

    def __init__(self, settings: GresoConfig, shape: StepShape, num_prompts: int):
        super().__init__(settings, shape, num_prompts)
        g = self.settings
        self.p_easy, self.p_hard = g.p_easy, g.p_hard
        # the streak of each training prompt's latest groups: all correct (easy) or all wrong (hard)
        self.easy_streak = np.zeros(num_prompts, dtype=np.int64)
        self.hard_streak = np.zeros(num_prompts, dtype=np.int64)
        self._step_counts = {"easy": 0, "hard": 0, "groups": 0}

    # --- the rule ---------------------------------------------------------------------------------

    def keep_probability(self, prompt: int) -> float:
        """max(p^z, floor) for a prompt on a streak of z, 1 without one."""
        floor = self.settings.skip_floor
        if self.easy_streak[prompt]:
            return max(self.p_easy ** int(self.easy_streak[prompt]), floor)
        if self.hard_streak[prompt]:
            return max(self.p_hard ** int(self.hard_streak[prompt]), floor)
        return 1.0

    def round_size(self, round_index: int, missing: int, zero_share: float | None) -> int:
        P = self.shape.prompts_per_step
        largest = self.settings.prompts_per_round or math.ceil(1.5 * P)
        smallest = min(self.settings.min_prompts_per_round or max(1, P // 4), largest)
        if round_index == 0 or zero_share is None or zero_share >= 1:
            return largest
        return min(max(math.ceil(missing / (1 - zero_share) * 1.25), smallest), largest)

    def candidates(self, sampler: RolloutSampler, count: int, round_index: int) -> tuple[list[int], int]:
        """Draw prompts, skipping each with probability 1 - keep_probability, until `count` are kept
        or a whole pass over the training prompts has been drawn."""
        rng = sampler.rng(round_index)

        def keep(prompt: int) -> bool:
            p = self.keep_probability(prompt)
            return p >= 1 or rng.random() < p

        kept, drawn = sampler.draw_where(count, keep)
        self._skipped += drawn - len(kept)
        return kept, drawn

    def observe(self, sampler: RolloutSampler, everyone: list[Graded]) -> None:
        for g in everyone:
            self.easy_streak[g.prompt] = self.easy_streak[g.prompt] + 1 if g.all_correct else 0
            self.hard_streak[g.prompt] = self.hard_streak[g.prompt] + 1 if g.all_wrong else 0
            self._step_counts["easy"] += g.all_correct
            self._step_counts["hard"] += g.all_wrong
            self._step_counts["groups"] += 1

    def finish_step(self, sampler: RolloutSampler, stats: dict) -> None:
        c, g = self._step_counts, self.settings
        if self._epoch > 0 and c["groups"]:
            for name, target in (("p_easy", g.target_zero_variance / 3), ("p_hard", g.target_zero_variance * 2 / 3)):
                share = c[name[2:]] / c["groups"]
                p = getattr(self, name) + (-g.p_step if share >= target else g.p_step)
                setattr(self, name, min(max(p, g.p_min), g.p_max))
        stats.update(prompts_skipped=self._skipped, p_easy=self.p_easy, p_hard=self.p_hard)

    def collect(self, sampler: RolloutSampler):
        self._epoch, self._skipped = sampler.epoch, 0
        self._step_counts = {"easy": 0, "hard": 0, "groups": 0}
        return super().collect(sampler)

    # --- checkpoints --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "p_easy": self.p_easy,
            "p_hard": self.p_hard,
            "easy_streak": self.easy_streak.tolist(),
            "hard_streak": self.hard_streak.tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.p_easy, self.p_hard = state["p_easy"], state["p_hard"]
        self.easy_streak = np.asarray(state["easy_streak"], dtype=np.int64)
        self.hard_streak = np.asarray(state["hard_streak"], dtype=np.int64)
