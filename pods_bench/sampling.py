"""The sampling layer under the trainer and the allocation strategies: the seeded prompt stream,
graded groups of rollouts, and the sampler that draws prompts, samples and grades them for one step.

    PromptStream    the training prompts in a fresh seeded order each epoch; its position is one
                    integer, the data cursor (saved in checkpoints)
    Groups          this process's graded groups: prompt, token ids, rewards, correctness, format
    Graded          one group as every process sees it (who holds it, its rewards)
    RolloutSampler  one step's access to the stream, the rollout engine and the grader: `draw`,
                    `sample`, `rng`; built by the trainer from its parts, handed to the strategy
    derived_seed    a seed from integers (run seed, step, rank, ...)
    timed           a phase's wall time, added to the step's times
    load_training_prompts  the task's training problems and their rendered prompts, as the stream
                    indexes them

Several processes: every decision about prompts (which to draw, skip, buffer, evict, commit) is
made identically on every process from the same information, so per-prompt state is the same
everywhere and a checkpoint of any process holds it. Each sampling call splits its prompts between
the processes (contiguous shares, or the process that holds a prompt's earlier rollouts), and every
process then learns every group's rewards (`Graded`, all-gathered: a few numbers per group).
Rollouts themselves stay on the process that sampled them: it trains on them.

Imports flow one way: this module knows the engines' and the grader's call signatures and the
values it is handed (the run seed, the sampling parameters, the grading mode, the task section),
nothing of the config as a whole, the trainer or the strategies.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pods_bench.errors import PodsBenchError
from pods_bench.rewards.grading import gold_texts
from pods_bench.tasks import load_problems
from pods_bench.tasks.hub import released_math_gold
from pods_bench.tasks.prompts import filter_by_prompt_length, render_prompts

if TYPE_CHECKING:
    import torch

    from pods_bench.sampling_config import SamplingConfig


def derived_seed(*parts: int) -> int:
    """A 31-bit seed from integers (run seed, step, rank, ...): distinct tuples give unrelated seeds."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0] >> 1)


@contextmanager
def timed(times: dict, phase: str, device):
    """Adds the phase's wall time to times[phase] (waiting for queued GPU work to finish)."""
    started = time.perf_counter()
    yield
    if device is not None and device.type == "cuda":
        import torch  # only here: the strategies' settings (and so the config) import this module

        torch.cuda.synchronize(device)
    times[phase] = times.get(phase, 0.0) + time.perf_counter() - started


class PromptStream:
    """The training prompts in a fresh seeded order each epoch. A cursor counts the prompts handed
    out so far, so the stream's position is one integer (saved in checkpoints)."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self._orders: dict[int, np.ndarray] = {}

    def take(self, cursor: int, count: int) -> list[int]:
        out = []
        for i in range(cursor, cursor + count):
            epoch, position = divmod(i, self.size)
            if epoch not in self._orders:
                self._orders = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.size)}
            out.append(int(self._orders[epoch][position]))
        return out


@dataclass
class Groups:
    """Graded rollout groups held by this process: group g holds the rollouts of training prompt
    `prompt[g]`, `len(completion_ids[g])` of them. Groups may differ in size (VIGOR, HORA): the
    per-rollout arrays hold every group's rollouts one after another, group g at
    `offsets[g]:offsets[g + 1]`. Built from (groups, k) arrays, they are flattened the same way."""

    prompt: list[int]  # index into the training prompts
    prompt_ids: list[list[int]]
    completion_ids: list[list[list[int]]]  # [group][rollout] token ids
    rewards: np.ndarray  # (rollouts,) what the trainer optimises
    correct: np.ndarray  # (rollouts,) 0/1 correctness
    format: np.ndarray  # (rollouts,) format score
    sampled_at: list[int]  # the step whose policy sampled the group (its oldest rollouts)

    def __post_init__(self):
        for name in ("rewards", "correct", "format"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.float64).reshape(-1))
        if not len(self.rewards) == len(self.correct) == len(self.format) == sum(self.sizes):
            raise ValueError("Groups: rewards, correctness and format must have one value per rollout")

    @classmethod
    def empty(cls) -> Groups:
        return cls([], [], [], np.zeros(0), np.zeros(0), np.zeros(0), [])

    def __len__(self) -> int:
        return len(self.prompt)

    @property
    def sizes(self) -> list[int]:
        """Rollouts per group."""
        return [len(c) for c in self.completion_ids]

    @property
    def offsets(self) -> np.ndarray:
        """(groups + 1,) where each group's rollouts start in the per-rollout arrays, and the end."""
        return np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)])

    def of_group(self, name: str, g: int) -> np.ndarray:
        """Group g's values of the per-rollout array `name` ("rewards", "correct", "format")."""
        start, end = self.offsets[g : g + 2]
        return getattr(self, name)[start:end]

    def per_group(self, name: str) -> list[np.ndarray]:
        """The per-rollout array `name`, one array per group."""
        return np.split(getattr(self, name), self.offsets[1:-1]) if len(self) else []

    def rows(self, index: list[int]) -> Groups:
        """The groups at `index`, in that order."""
        pick = lambda name: np.concatenate([self.of_group(name, i) for i in index]) if index else np.zeros(0)
        return Groups(
            [self.prompt[i] for i in index],
            [self.prompt_ids[i] for i in index],
            [self.completion_ids[i] for i in index],
            pick("rewards"),
            pick("correct"),
            pick("format"),
            [self.sampled_at[i] for i in index],
        )

    @staticmethod
    def concat(parts: list[Groups]) -> Groups:
        """The groups of `parts` one after another."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return Groups.empty()
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
        """Plain lists, per group (for checkpoints: comparable with ==, no pickled classes)."""
        return {
            "prompt": self.prompt,
            "prompt_ids": self.prompt_ids,
            "completion_ids": self.completion_ids,
            **{name: [a.tolist() for a in self.per_group(name)] for name in ("rewards", "correct", "format")},
            "sampled_at": self.sampled_at,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Groups:
        flat = lambda groups: np.asarray([x for g in groups for x in g], dtype=np.float64)
        arrays = {k: flat(d[k]) for k in ("rewards", "correct", "format")}
        return cls(d["prompt"], d["prompt_ids"], d["completion_ids"], sampled_at=d["sampled_at"], **arrays)

    def join(self, more: Groups) -> Groups:
        """Each group with `more`'s rollouts of the same prompt appended (Pilot-Commit: pilot + commit;
        VIGOR: one round's rollouts)."""
        if self.prompt != more.prompt:
            raise ValueError("join: the groups are not of the same prompts in the same order")
        both = lambda name: np.concatenate(
            [x for a, b in zip(self.per_group(name), more.per_group(name)) for x in (a, b)] or [np.zeros(0)]
        )
        return Groups(
            self.prompt,
            self.prompt_ids,
            [a + b for a, b in zip(self.completion_ids, more.completion_ids)],
            both("rewards"),
            both("correct"),
            both("format"),
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
    """One training step's access to the prompts, the rollout engine and the grader.

    `draw(count)` takes the next prompts of the seeded stream (`cursor` moves on; the trainer keeps
    it after the step); `sample(prompts, k)` samples and grades k rollouts of each, timed as the
    step's "gen" and "reward" phases; `rng(...)` is a generator that is the same on every process
    and after a resume.

    Collaborators: `prompts` (rendered prompt texts) and `problems` (their gold answers) of the
    training split, `engine` (generate(prompts, k, sampling) -> Rollouts, pods_bench/engines/),
    `flops` (pods_bench.flops.FlopsCounter: the generation FLOPs it counts; None: none),
    `grade` (texts, golds -> RewardBreakdown: pods_bench.rewards.RewardFunction), this process's
    `rank` of `world`, and `device` for timing. Of the config it gets the run `seed`, the `sampling`
    parameters (sampling.seed None: the sampler's seeds derive from `seed`) and the `grading` mode
    of the golds (reward.grading)."""

    def __init__(
        self,
        stream: PromptStream,
        *,
        seed: int,
        sampling: SamplingConfig,
        grading: str,
        step: int,
        cursor: int,
        prompts: list[str],
        problems: list | None = None,
        engine: Any = None,
        grade: Any = None,
        rank: int = 0,
        world: int = 1,
        device: torch.device | None = None,
        flops: Any = None,
    ):
        self.seed, self.sampling, self.grading = seed, sampling, grading
        self.stream, self.step, self.cursor = stream, step, cursor
        self.prompts, self.problems, self.engine, self.grade = prompts, problems or [], engine, grade
        self.rank, self.world, self.device, self.flops = rank, world, device, flops
        self.times: dict[str, float] = {}  # the step's "gen" and "reward" seconds on this process
        self.calls = 0
        # this process's sampling work in the step (summed over processes in the log)
        self.counts = {
            "rollouts_generated": 0,
            "generated_tokens": 0,
            "decode_steps": 0,
            "decode_sequence_steps": 0,
            "reward_failures": 0,
            "flops_gen": 0.0,
        }

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    @property
    def epoch(self) -> int:
        """Passes over the training prompts completed before this draw."""
        return self.cursor // self.num_prompts

    def draw(self, count: int) -> list[int]:
        """The next `count` training prompts of the stream (a fresh seeded order each epoch)."""
        prompts = self.stream.take(self.cursor, count)
        self.cursor += count
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
        return np.random.default_rng([self.seed, self.step, *tag])

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
        owners = self.shares(len(prompts)) if owners is None else owners
        mine = [i for i, owner in zip(prompts, owners) if owner == self.rank]
        groups = [i for i in mine for _ in range(repeats)]
        base = self.sampling.seed if self.sampling.seed is not None else self.seed
        # the first call of a step keeps the seed a one-call step always had
        seed = (
            derived_seed(base, self.step, self.rank)
            if self.calls == 0
            else derived_seed(base, self.step, self.rank, self.calls)
        )
        self.calls += 1
        local = Groups.empty()
        if groups:
            with timed(self.times, "gen", self.device):
                rollouts = self.engine.generate(
                    [self.prompts[i] for i in groups], k, replace(self.sampling, seed=seed)
                )
            with timed(self.times, "reward", self.device):
                golds = gold_texts([self.problems[i] for i in groups], self.grading)
                texts = [t for group in rollouts.completion_text for t in group]
                graded = self.grade(texts, [g for g in golds for _ in range(k)])
            local = Groups(
                groups,
                rollouts.prompt_ids,
                rollouts.completion_ids,
                graded.total,
                graded.correctness,
                graded.format,
                [self.step] * len(groups),
            )
            self.counts["rollouts_generated"] += len(groups) * k
            self.counts["generated_tokens"] += rollouts.generated_tokens
            self.counts["decode_steps"] += rollouts.decode_steps
            self.counts["decode_sequence_steps"] += rollouts.decode_sequence_steps
            self.counts["reward_failures"] += graded.n_timeouts + graded.n_errors
            if self.flops is not None:
                self.counts["flops_gen"] += sum(
                    self.flops.generation(len(p), [len(c) for c in group])
                    for p, group in zip(rollouts.prompt_ids, rollouts.completion_ids)
                )
        with timed(self.times, "reward", self.device):
            everyone = self.gather(
                [
                    Graded(
                        p,
                        self.rank,
                        row,
                        tuple(local.of_group("rewards", row).tolist()),
                        tuple(local.of_group("correct", row).tolist()),
                    )
                    for row, p in enumerate(local.prompt)
                ]
            )
        return local, everyone

    def gather(self, items: list) -> list:
        """Every process's `items`, concatenated in process order (the same list on every process)."""
        if self.world == 1:
            return list(items)
        import torch.distributed as dist  # several processes: torch is loaded by then

        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, items)
        return [x for part in parts for x in part]


def load_training_prompts(task, data_dir: str | None, tokenizer):
    """(problems, prompts, number dropped as too long) of the training split of `task` (the config's
    task section: name, split, limit, math_gold, max_prompt_tokens and the prompt's style), read
    from `data_dir` (None: PODS_BENCH_DATA_DIR or the hub)."""
    problems = load_problems(task.name, task.split, data_dir=data_dir, limit=task.limit)
    if not problems:
        raise PodsBenchError(f"task {task.name!r} split {task.split!r} has no rows")
    if task.math_gold == "released" and task.name == "math":  # exact replication of a known bug
        problems = [replace(p, gold=released_math_gold(p.solution)) for p in problems]
    prompts = render_prompts(problems, tokenizer, task)
    kept, dropped = filter_by_prompt_length(prompts, tokenizer, task.max_prompt_tokens)
    if not kept:
        raise PodsBenchError(f"no prompt of task {task.name!r} fits task.max_prompt_tokens={task.max_prompt_tokens}")
    return [problems[i] for i in kept], [prompts[i] for i in kept], dropped
