"""Benchmark tasks: named problem sets with gold answers, in a registry.

A task module defines a `Task` and calls `register_task(task)` (tasks/base.py) at import; the
imports at the bottom of this file make every task available as soon as `pods_bench.tasks` is
imported.

    problems = load_problems("gsm8k", "test", data_dir="../shared/data", limit=100)
    problems[0] == Problem(id="gsm8k/test/0", question="Janet's ducks ...", gold="18", solution="...")
"""

from __future__ import annotations

import importlib.util

from pods_bench.tasks.base import (
    DATA_DIR_ENV,
    TASKS,
    Problem,
    Task,
    get_task,
    load_problems,
    register_task,
    resolve_data_dir,
)

__all__ = [
    "DATA_DIR_ENV",
    "TASKS",
    "Problem",
    "Task",
    "cli_show",
    "get_task",
    "load_problems",
    "register_task",
    "resolve_data_dir",
]


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
