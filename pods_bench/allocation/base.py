"""The allocation strategy's interface and the round-limit checks strategies that sample in rounds
share. What a strategy works with (graded groups, the sampler of a step) is the sampling layer,
pods_bench/sampling.py; a strategy imports that and this module, nothing of the trainer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

from pods_bench.errors import PodsBenchError, require
from pods_bench.plugins import Registry
from pods_bench.sampling import Graded, Groups, RolloutSampler

# name -> strategy class; each strategy module registers itself with its settings dataclass, the
# config section allocation.<name> (`@ALLOCATION_STRATEGIES.register(name, settings=...)`)
ALLOCATION_STRATEGIES = Registry("strategy", "allocation.strategy")


@dataclass(frozen=True)
class StepShape:
    """The few values of the config every strategy works to: prompts a step trains on (P, over all
    processes), rollouts per group (selection.n) and groups per prompt (selection.groups_per_prompt)."""

    prompts_per_step: int
    n: int
    groups_per_prompt: int = 1


class AllocationStrategy(ABC):
    """Decides which prompts get how many rollouts in each step. Subclasses register in
    ALLOCATION_STRATEGIES, with the dataclass of their settings if they have any; a strategy gets
    those settings (its config section allocation.<name>, typed; None without a dataclass) and the
    step's shape, nothing else of the config. What it keeps between steps is in `state_dict` (saved
    in every checkpoint, restored on resume)."""

    groups_per_prompt = False  # whether it samples selection.groups_per_prompt groups of a prompt
    # the names of the counters `collect` returns, each a train_log field after the step record: the
    # one place they are declared (tests/test_results_format.py checks the log and the docs against it)
    counters: tuple[str, ...] = ()
    # settings of its section allocation.<name> under which one step of a tiny run (4 prompts x
    # 4 rollouts, P x n = 16) finishes: what tests/test_results_format.py trains each strategy with,
    # so a new strategy is covered there without editing the test
    example_settings: dict = {}

    def __init__(self, settings: Any, shape: StepShape, num_prompts: int):
        self.settings, self.shape, self.num_prompts = settings, shape, num_prompts

    @classmethod
    def check_config(cls, settings: Any, shape: StepShape) -> None:
        """What the strategy needs of its settings given the step's shape (its own section checks
        its fields itself, in its dataclass's `__post_init__`)."""

    @abstractmethod
    def collect(self, sampler: RolloutSampler) -> tuple[Groups, dict]:
        """(this process's groups to train on, each with selection.n rollouts; the step's counters for
        the log, the same on every process)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class GrowingGroups:
    """A step's groups grown round by round (VIGOR, HORA), one group per slot of the step's draw
    (its position in the drawn list), not per prompt id: a draw that crosses an epoch boundary can
    hold one prompt twice, and each of its slots is then a group of its own. A slot's later rollouts
    are sampled on the process that holds its first ones, so a group stays whole.

    `prompts` is the step's draw and (`local`, `everyone`) the first sampling call's answer for it,
    made with the default contiguous shares, so `everyone` is in the order of `prompts`."""

    def __init__(self, sampler: RolloutSampler, prompts: list[int], local: Groups, everyone: list[Graded]):
        if [g.prompt for g in everyone] != list(prompts):
            raise ValueError("GrowingGroups: the graded groups are not those of the draw, in its order")
        self.prompts, self.rank = list(prompts), sampler.rank
        self.owner = [g.owner for g in everyone]  # slot -> the process that holds its rollouts
        self.mine = {s: local.rows([row]) for row, s in enumerate(self._held_here(range(len(prompts))))}

    def _held_here(self, slots) -> list[int]:
        """The slots among `slots` this process holds, in that order (its rows of a sampling call's Groups)."""
        return [s for s in slots if self.owner[s] == self.rank]

    def add(self, sampler: RolloutSampler, slots: list[int], k: int) -> list[Graded]:
        """k more rollouts of the groups at `slots` (in draw order), joined to them; every process's
        outcomes, in the order of `slots`."""
        prompts = [self.prompts[s] for s in slots]
        more, graded = sampler.sample(prompts, k, owners=[self.owner[s] for s in slots])
        if [g.prompt for g in graded] != prompts:
            raise ValueError("GrowingGroups: the graded groups are not those asked for, in that order")
        for row, s in enumerate(self._held_here(slots)):
            self.mine[s] = self.mine[s].join(more.rows([row]))
        return graded

    def batch(self) -> Groups:
        """This process's groups, in the order drawn."""
        return Groups.concat([self.mine[s] for s in sorted(self.mine)])


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
