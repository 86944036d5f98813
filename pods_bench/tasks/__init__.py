"""Benchmark tasks: named problem sets with gold answers, in a registry.

A task module defines a `Task` and calls `register_task(task)` at import; the imports at the bottom
of this file make every task available as soon as `pods_bench.tasks` is imported.

    problems = load_problems("gsm8k", "test", data_dir="../shared/data", limit=100)
    problems[0] == Problem(id="gsm8k/test/0", question="Janet's ducks ...", gold="18", solution="...")
"""

from __future__ import annotations

import importlib.util
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
    problems = get_task(name).load(split, data_dir)
    return problems if limit is None else problems[:limit]


def cli_show(args) -> int:
    """`pods-bench tasks [TASK]`: list the tasks, or print a few problems of one with their golds."""
    if args.task is None:
        width = max(map(len, TASKS))
        for task in TASKS.values():
            print(f"{task.name:<{width}}  splits: {', '.join(task.splits):<12}  source: {task.source}")
        return 0
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    for problem in load_problems(args.task, args.split, args.data_dir, args.limit):
        print(f"[{problem.id}]\n{problem.question.strip()}\n=> gold: {problem.gold}\n")
    return 0


# --- registration: importing a task module registers its tasks --------------------------------
from pods_bench.tasks import hub  # noqa: E402,F401

if importlib.util.find_spec("pods_bench.tasks.arith") is not None:  # the smoke task, where present
    from pods_bench.tasks import arith  # noqa: E402,F401
