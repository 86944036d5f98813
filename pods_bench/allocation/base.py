"""What an allocation strategy works with: graded groups of rollouts, and a sampler that draws
prompts, samples and grades them for one training step.

Several processes: every decision about prompts (which to draw, skip, buffer, evict, commit) is
made identically on every process from the same information, so per-prompt state is the same
everywhere and a checkpoint of any process holds it. Each sampling call splits its prompts between
the processes (contiguous shares, or the process that holds a prompt's earlier rollouts), and every
process then learns every group's rewards (`Graded`, all-gathered: a few numbers per group).
Rollouts themselves stay on the process that sampled them: it trains on them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pods_bench.errors import PodsBenchError

if TYPE_CHECKING:
    from pods_bench.config import TrainConfig


@dataclass
class Groups:
    """Graded rollout groups held by this process: row g holds the rollouts of training prompt `prompt[g]`."""

    prompt: list[int]  # index into the training prompts
    prompt_ids: list[list[int]]
    completion_ids: list[list[list[int]]]  # [group][rollout] token ids
    rewards: np.ndarray  # (groups, k) what the trainer optimises
    correct: np.ndarray  # (groups, k) 0/1 correctness
    format: np.ndarray  # (groups, k) format score
    sampled_at: list[int]  # the step whose policy sampled the group (its oldest rollouts)

    @classmethod
    def empty(cls, k: int = 0) -> Groups:
        return cls([], [], [], np.zeros((0, k)), np.zeros((0, k)), np.zeros((0, k)), [])

    def __len__(self) -> int:
        return len(self.prompt)

    def rows(self, index: list[int]) -> Groups:
        """The groups at `index`, in that order."""
        return Groups(
            [self.prompt[i] for i in index],
            [self.prompt_ids[i] for i in index],
            [self.completion_ids[i] for i in index],
            self.rewards[index],
            self.correct[index],
            self.format[index],
            [self.sampled_at[i] for i in index],
        )

    @staticmethod
    def concat(parts: list[Groups], k: int) -> Groups:
        """The groups of `parts` one after another (all with k rollouts)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return Groups.empty(k)
        return Groups(
            [x for p in parts for x in p.prompt],
            [x for p in parts for x in p.prompt_ids],
            [x for p in parts for x in p.completion_ids],
            np.concatenate([p.rewards for p in parts]),
            np.concatenate([p.correct for p in parts]),
            np.concatenate([p.format for p in parts]),
            [x for p in parts for x in p.sampled_at],
        )

    def to_dict(self) -> dict:
        """Plain lists (for checkpoints: comparable with ==, no pickled classes)."""
        return {
            "prompt": self.prompt,
            "prompt_ids": self.prompt_ids,
            "completion_ids": self.completion_ids,
            "rewards": self.rewards.tolist(),
            "correct": self.correct.tolist(),
            "format": self.format.tolist(),
            "sampled_at": self.sampled_at,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Groups:
        arrays = {k: np.asarray(d[k], dtype=np.float64) for k in ("rewards", "correct", "format")}
        return cls(d["prompt"], d["prompt_ids"], d["completion_ids"], sampled_at=d["sampled_at"], **arrays)

    def join(self, more: Groups) -> Groups:
        """Each group with `more`'s rollouts of the same prompt appended (Pilot-Commit: pilot + commit)."""
        if self.prompt != more.prompt:
            raise ValueError("join: the groups are not of the same prompts in the same order")
        return Groups(
            self.prompt,
            self.prompt_ids,
            [a + b for a, b in zip(self.completion_ids, more.completion_ids)],
            np.concatenate([self.rewards, more.rewards], axis=1),
            np.concatenate([self.correct, more.correct], axis=1),
            np.concatenate([self.format, more.format], axis=1),
            [min(a, b) for a, b in zip(self.sampled_at, more.sampled_at)],
        )


@dataclass(frozen=True)
class Graded:
    """One group of a sampling call as every process sees it: the prompt, who holds its rollouts
    (process `owner`, row `row` of that process's Groups) and its outcome."""

    prompt: int
    owner: int
    row: int
    rewards: tuple[float, ...]
    correct: tuple[float, ...]

    @property
    def pass_rate(self) -> float:
        return sum(self.correct) / len(self.correct)

    def differs(self, metric: str = "reward") -> bool:
        """Its rewards ("reward"; GRPO gives it a non-zero advantage) or its correctness ("correct")
        are not all equal."""
        values = self.rewards if metric == "reward" else self.correct
        return max(values) > min(values)

    @property
    def all_correct(self) -> bool:
        return min(self.correct) == 1

    @property
    def all_wrong(self) -> bool:
        return max(self.correct) == 0


class RolloutSampler:
    """One training step's access to prompts, the rollout engine and the grader (pods_bench.train.Run).

    `draw(count)` takes the next prompts of the seeded stream (the run's data cursor moves on);
    `sample(prompts, k)` samples and grades k rollouts of each, timed as the step's "gen" and "reward"
    phases; `rng(...)` is a generator that is the same on every process and after a resume."""

    def __init__(self, run, stream, times: dict):
        self.run, self.stream, self.times = run, stream, times
        self.cfg: TrainConfig = run.cfg
        self.step = run.progress.step
        self.rank, self.world = run.accelerator.process_index, run.accelerator.num_processes
        self.calls = 0
        # this process's sampling work in the step (summed over processes in the log)
        self.counts = {
            "rollouts_generated": 0,
            "generated_tokens": 0,
            "decode_steps": 0,
            "decode_sequence_steps": 0,
            "reward_failures": 0,
        }

    @property
    def num_prompts(self) -> int:
        return len(self.run.prompts)

    @property
    def epoch(self) -> int:
        """Passes over the training prompts completed before this draw."""
        return self.run.progress.cursor // self.num_prompts

    def draw(self, count: int) -> list[int]:
        """The next `count` training prompts of the stream (a fresh seeded order each epoch)."""
        p = self.run.progress
        prompts = self.stream.take(p.cursor, count)
        p.cursor += count
        return prompts

    def draw_where(self, count: int, keep) -> tuple[list[int], int]:
        """(the next `count` prompts of the stream for which `keep(prompt)` holds, prompts drawn in
        all): drawn prompts that fail `keep` are consumed; at most one pass over the training prompts."""
        kept, drawn = [], 0
        while len(kept) < count and drawn < self.num_prompts:
            chunk = self.draw(min(count - len(kept), self.num_prompts - drawn))
            drawn += len(chunk)
            kept += [prompt for prompt in chunk if keep(prompt)]
        return kept, drawn

    def rng(self, *tag: int) -> np.random.Generator:
        """Random numbers for the strategy's decisions: derived from (seed, step, tag), so the same on
        every process and when a resumed run replays the step."""
        return np.random.default_rng([self.cfg.seed, self.step, *tag])

    def shares(self, count: int) -> list[int]:
        """The process that samples each of `count` prompts when no one holds them yet: contiguous shares."""
        return [
            rank
            for rank in range(self.world)
            for _ in range(count * (rank + 1) // self.world - count * rank // self.world)
        ]

    def sample(self, prompts: list[int], k: int, owners: list[int] | None = None, repeats: int = 1):
        """k rollouts of each of `prompts` (the same list on every process), graded: (this process's
        Groups, every process's `Graded` in the order of `prompts`). Prompt i is sampled by process
        owners[i] (default: contiguous shares), `repeats` times as independent groups."""
        from pods_bench.rewards import gold_texts
        from pods_bench.train import derived_seed, timed

        run, cfg = self.run, self.cfg
        owners = self.shares(len(prompts)) if owners is None else owners
        mine = [i for i, owner in zip(prompts, owners) if owner == self.rank]
        groups = [i for i in mine for _ in range(repeats)]
        base = cfg.sampling.seed if cfg.sampling.seed is not None else cfg.seed
        # the first call of a step keeps the seed a one-call step always had
        seed = (
            derived_seed(base, self.step, self.rank)
            if self.calls == 0
            else derived_seed(base, self.step, self.rank, self.calls)
        )
        self.calls += 1
        local = Groups.empty(k)
        if groups:
            with timed(self.times, "gen", run.accelerator.device):
                rollouts = run.engine.generate([run.prompts[i] for i in groups], k, replace(cfg.sampling, seed=seed))
            with timed(self.times, "reward", run.accelerator.device):
                golds = gold_texts([run.problems[i] for i in groups], cfg.reward.grading)
                texts = [t for group in rollouts.completion_text for t in group]
                graded = run.reward_fn(texts, [g for g in golds for _ in range(k)])
            shape = (len(groups), k)
            local = Groups(
                groups,
                rollouts.prompt_ids,
                rollouts.completion_ids,
                np.asarray(graded.total, dtype=np.float64).reshape(shape),
                np.asarray(graded.correctness, dtype=np.float64).reshape(shape),
                np.asarray(graded.format, dtype=np.float64).reshape(shape),
                [self.step] * len(groups),
            )
            self.counts["rollouts_generated"] += len(groups) * k
            self.counts["generated_tokens"] += rollouts.generated_tokens
            self.counts["decode_steps"] += rollouts.decode_steps
            self.counts["decode_sequence_steps"] += rollouts.decode_sequence_steps
            self.counts["reward_failures"] += graded.n_timeouts + graded.n_errors
        with timed(self.times, "reward", run.accelerator.device):
            everyone = self.gather(
                [
                    Graded(p, self.rank, row, tuple(local.rewards[row].tolist()), tuple(local.correct[row].tolist()))
                    for row, p in enumerate(local.prompt)
                ]
            )
        return local, everyone

    def gather(self, items: list) -> list:
        """Every process's `items`, concatenated in process order (the same list on every process)."""
        if self.world == 1:
            return list(items)
        import torch.distributed as dist

        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, items)
        return [x for part in parts for x in part]


class AllocationStrategy(ABC):
    """Decides which prompts get how many rollouts in each step. Subclasses register in
    pods_bench.allocation.ALLOCATION_STRATEGIES; what they keep between steps is in `state_dict`
    (saved in every checkpoint, restored on resume)."""

    def __init__(self, cfg: TrainConfig, num_prompts: int):
        self.cfg, self.num_prompts = cfg, num_prompts

    @abstractmethod
    def collect(self, sampler: RolloutSampler) -> tuple[Groups, dict]:
        """(this process's groups to train on, each with selection.n rollouts; the step's counters for
        the log, the same on every process)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


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
