"""What a task is: a `Problem`, a `Task` (named splits of problems), the registry every task module
adds itself to, and where local data is read from. Task modules (hub.py, arith.py) import this;
`pods_bench.tasks` imports them, so importing it makes every task available."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pods_bench.errors import PodsBenchError

DATA_DIR_ENV = "PODS_BENCH_DATA_DIR"


@dataclass(frozen=True)
class Problem:
    id: str  # stable across runs, e.g. "gsm8k/test/17"
    question: str
    gold: str  # the final answer that rewards grade against
    solution: str | None = None  # worked solution, when the dataset has one


class Task:
    """A named set of problems in one or more splits. Subclasses set `name` and `splits` and
    implement `load`."""

    name: str
    splits: tuple[str, ...]

    @property
    def source(self) -> str:
        """Where the problems come from, for listings."""
        return self.name

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise PodsBenchError(f"task {self.name!r} has no split {split!r} (splits: {', '.join(self.splits)})")

    def load(self, split: str, data_dir: str | Path | None = None) -> list[Problem]:
        raise NotImplementedError

    def load_first(self, split: str, count: int | None, data_dir: str | Path | None = None) -> list[Problem]:
        """The split's first `count` problems (None: all of them). A task that can make a prefix
        without the rest (a generated one) overrides this."""
        problems = self.load(split, data_dir)
        return problems if count is None else problems[:count]


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise PodsBenchError(f"unknown task {name!r} (known: {', '.join(sorted(TASKS))})")
    return TASKS[name]


def resolve_data_dir(data_dir: str | Path | None) -> Path | None:
    """The local data folder to read: `data_dir`, else $PODS_BENCH_DATA_DIR, else None (the hub)."""
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV) or None
    return Path(data_dir) if data_dir is not None else None


def load_problems(
    name: str, split: str, data_dir: str | Path | None = None, limit: int | None = None
) -> list[Problem]:
    if limit is not None and limit < 0:
        raise PodsBenchError(f"problem limit must be >= 0, got {limit}")
    return get_task(name).load_first(split, limit, data_dir)
