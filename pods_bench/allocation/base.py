"""The allocation strategy's interface and the round-limit checks strategies that sample in rounds
share. What a strategy works with (graded groups, the sampler of a step) is the sampling layer,
pods_bench/sampling.py; a strategy imports that and this module, nothing of the trainer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pods_bench.errors import PodsBenchError, require
from pods_bench.plugins import Registry
from pods_bench.sampling import Graded, Groups, RolloutSampler

if TYPE_CHECKING:
    from pods_bench.config import TrainConfig


# name -> strategy class; each strategy module registers itself with its settings dataclass, the
# config section allocation.<name> (`@ALLOCATION_STRATEGIES.register(name, settings=...)`)
ALLOCATION_STRATEGIES = Registry("strategy", "allocation.strategy")


class AllocationStrategy(ABC):
    """Decides which prompts get how many rollouts in each step. Subclasses register in
    ALLOCATION_STRATEGIES; what they keep between steps is in `state_dict` (saved in every
    checkpoint, restored on resume)."""

    groups_per_prompt = False  # whether it samples selection.groups_per_prompt groups of a prompt

    def __init__(self, cfg: TrainConfig, num_prompts: int):
        self.cfg, self.num_prompts = cfg, num_prompts

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        """What the strategy needs of the other config sections (its own section checks itself)."""

    @abstractmethod
    def collect(self, sampler: RolloutSampler) -> tuple[Groups, dict]:
        """(this process's groups to train on, each with selection.n rollouts; the step's counters for
        the log, the same on every process)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class GrowingGroups:
    """A step's groups grown round by round (VIGOR, HORA): this process's groups by prompt, each
    prompt's later rollouts sampled on the process that holds its first ones, so a group stays whole."""

    def __init__(self, local: Groups, everyone: list[Graded]):
        self.mine = {p: local.rows([i]) for i, p in enumerate(local.prompt)}
        self.owner = {g.prompt: g.owner for g in everyone}

    def add(self, sampler: RolloutSampler, prompts: list[int], k: int) -> list[Graded]:
        """k more rollouts of each of `prompts`, joined to their groups; every process's outcomes."""
        more, graded = sampler.sample(prompts, k, owners=[self.owner[p] for p in prompts])
        for i, p in enumerate(more.prompt):
            self.mine[p] = self.mine[p].join(more.rows([i]))
        return graded

    def batch(self, prompts: list[int]) -> Groups:
        """This process's groups, in the order of `prompts`."""
        return Groups.concat([self.mine[p] for p in prompts if p in self.mine])


@dataclass
class RoundsConfig:
    """How a strategy that samples in rounds stops: after `max_rounds` rounds (0: no limit, but never
    more than one pass over the training prompts in one step) without a full batch it stops the run
    with one line ("error", as DAPO's and Pilot-Commit's code raise) or trains on what it has ("train")."""

    max_rounds: int = 10  # verl's algorithm.filter_groups.max_num_gen_batches / Pilot-Commit's
    when_short: Literal["error", "train"] = "error"

    def _check(self, section: str) -> None:
        require(self.max_rounds >= 0, f"config key allocation.{section}.max_rounds must be >= 0 (0: no limit)")


def short_batch(strategy: str, rounds_cfg, have: int, want: int, rounds: int, why: str) -> bool:
    """Whether a step that has `have` of `want` groups after `rounds` rounds may go on with another
    round (True), trains on what it has (False), or stops the run (one line)."""
    if rounds_cfg.max_rounds == 0 or rounds < rounds_cfg.max_rounds:
        return True
    if rounds_cfg.when_short == "train":
        return False
    raise PodsBenchError(
        f"allocation.{strategy}: {have} of the {want} groups a step trains on after {rounds} rounds ({why}); "
        f"raise allocation.{strategy}.max_rounds (0: no limit) or set allocation.{strategy}.when_short=train"
    )


def check_not_exhausted(
    rounds_cfg, strategy: str, drawn: int, num_prompts: int, have: int, want: int, why: str
) -> None:
    """A step without a round limit (max_rounds 0) stops once it has drawn more than one whole pass
    over the training prompts: more passes would only see the same prompts again."""
    if rounds_cfg.max_rounds == 0 and drawn > num_prompts and have < want:
        raise PodsBenchError(
            f"allocation.{strategy}: {have} of the {want} groups a step trains on after drawing every one of the "
            f"{num_prompts} training prompts ({why})"
        )
