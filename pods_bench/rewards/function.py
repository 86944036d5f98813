"""The reward function: `RewardConfig` (weights, format style, grading mode, recipe, workers and
timeouts), `RewardFunction` (completions and golds -> `RewardBreakdown`), which grades in the
worker pool, or in the calling thread with workers=0."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import threading
import time
import weakref
from dataclasses import dataclass, field, fields

import numpy as np

from pods_bench.errors import PodsBenchError
from pods_bench.rewards.extraction import braces_balance
from pods_bench.rewards.grading import (
    _BY_SEVERITY,
    _MAX_COMPLETION_CHARS,
    _SEVERITY,
    ERROR,
    GRADING_MODES,
    KILLED,
    OK,
    TIMEOUT,
    _Grader,
)
from pods_bench.rewards.pool import _GraderPool
from pods_bench.rewards.recipes import RECIPE_FIELDS, REWARD_RECIPES
from pods_bench.rewards.shaping import FORMAT_STYLES

# --- the reward function -----------------------------------------------------------------------


def _default_workers() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(2, cpus)


@dataclass
class RewardConfig:
    correctness_weight: float = 1.0
    format_weight: float = 0.1  # paper: 0.1 x format_score
    tag_weight: float = 0.1  # paper: 0.1 x tag_score (0.025 per well-formed tag)
    timeout_s: float = 1.0  # math-verify's own parse / verify timeouts (SIGALRM: whole seconds, >= 1)
    deadline_s: float | None = None  # hard wall-clock limit per item; None -> 6 x timeout_s + 2
    workers: int = field(default_factory=_default_workers)  # 0: grade in the calling (main) thread
    start_method: str = "forkserver"  # or "fork" / "spawn"; forkserver is safe beside torch threads
    memory_limit_mb: int | None = 4096  # extra address space a grading process may allocate
    max_answer_chars: int = 1000  # longer extracted answers are graded wrong without parsing
    format_style: str = "pods"  # FORMAT_STYLES: "pods" (single-GPU code) or "open-r1" (multi-GPU)
    shaping_only_when_wrong: bool = False  # format and tag terms count only for wrong answers
    grading: str = "pods-bench"  # GRADING_MODES: which candidate answers are graded, and how
    # a named recipe (pods_bench/rewards/recipes.py) fixes the weights, style, gating and grading above;
    # "custom": the keys as given
    recipe: str = "custom"

    def __post_init__(self):
        if self.recipe != "custom":
            if self.recipe not in REWARD_RECIPES:
                raise PodsBenchError(
                    f"reward recipe {self.recipe!r} is not one of custom, {', '.join(REWARD_RECIPES)}"
                )
            recipe, defaults = REWARD_RECIPES[self.recipe], {f.name: f.default for f in fields(self)}
            for name in RECIPE_FIELDS:
                value = getattr(self, name)
                if value not in (defaults[name], getattr(recipe, name)):
                    raise PodsBenchError(
                        f"reward {name} is set by recipe {self.recipe!r} ({getattr(recipe, name)!r}); "
                        f"remove it or use recipe custom"
                    )
                setattr(self, name, getattr(recipe, name))
        if self.workers < 0:
            raise PodsBenchError(f"reward workers must be >= 0, got {self.workers}")
        if self.timeout_s <= 0:
            raise PodsBenchError(f"reward timeout_s must be > 0, got {self.timeout_s}")
        if self.grading not in GRADING_MODES:
            raise PodsBenchError(f"reward grading {self.grading!r} is not one of {', '.join(GRADING_MODES)}")
        if self.format_style not in FORMAT_STYLES:
            raise PodsBenchError(f"reward format_style {self.format_style!r} is not one of {', '.join(FORMAT_STYLES)}")
        if self.start_method not in mp.get_all_start_methods():
            raise PodsBenchError(
                f"reward start_method {self.start_method!r} is not one of {mp.get_all_start_methods()}"
            )

    @property
    def timeout_int(self) -> int:
        return max(1, math.ceil(self.timeout_s))

    @property
    def item_deadline_s(self) -> float:
        # worst honest case: gold parse + two answer parses + up to 2 x 2 verify comparisons, each
        # stopped by math-verify's own alarm; beyond this the worker is stuck in C code.
        return self.deadline_s if self.deadline_s is not None else 6 * self.timeout_int + 2


@dataclass
class RewardBreakdown:
    total: np.ndarray  # weighted sum, what the trainer optimises
    correctness: np.ndarray  # 0/1
    format: np.ndarray  # format_score in [0, 1], unweighted
    tags: np.ndarray  # tag_score in [0, 1], unweighted
    n_timeouts: int  # items stopped by math-verify's timeout or the hard deadline (scored 0)
    n_errors: int  # items on which the verifier raised (scored 0)
    seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # grading wall time per item
    n_killed: int = 0  # of n_timeouts, items stopped by the hard deadline (their worker was killed)


class RewardFunction:
    """Callable reward: `RewardFunction(config)(completions, golds) -> RewardBreakdown`.

    Owns its grading processes (started on first use); always close it: `with RewardFunction() as
    reward: ...` or `.close()`. Processes are also shut down when the object is garbage collected
    and at interpreter exit."""

    def __init__(self, config: RewardConfig | None = None):
        self.config = config or RewardConfig()
        self._pool: _GraderPool | None = None
        self._finalizer = None
        self._gold_cache: dict = {}  # workers=0 only

    # -- lifecycle
    def _ensure_pool(self) -> _GraderPool:
        if self._pool is None:
            c = self.config
            self._pool = _GraderPool(c.workers, c.start_method, c.timeout_int, c.memory_limit_mb)
            self._finalizer = weakref.finalize(self, self._pool.close)
        return self._pool

    def worker_pids(self) -> list[int]:
        return self._pool.pids() if self._pool else []

    @property
    def worker_restarts(self) -> int:
        return self._pool.restarts if self._pool else 0

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs _pool.close once
        self._pool = self._finalizer = None

    def __enter__(self) -> RewardFunction:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- grading
    def grade(
        self, answers: list[str | None], golds: list[str], mode: str = "answer"
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Correctness of candidate answers: (scores, statuses, seconds) arrays. `mode`: see `_Grader.grade`."""
        if mode == "answer":
            # Not worth parsing, graded wrong: over-long answers (no real one is) and unbalanced braces
            # (not LaTeX; math-verify's parser can spend seconds on them, past its own alarm).
            cap = self.config.max_answer_chars
            answers = [a if a is not None and len(a) <= cap and braces_balance(a) else None for a in answers]
        else:  # whole completions (open-r1): prose may hold a stray brace; the deadline still bounds them
            answers = [a if a is not None and len(a) <= _MAX_COMPLETION_CHARS else None for a in answers]
        if not answers:
            results = {}
        elif self.config.workers == 0:
            results = self._grade_here(answers, golds, mode)
        else:
            results = self._ensure_pool().grade(self._chunks(answers, golds, mode), self.config.item_deadline_s)
        rows = [results[i] for i in range(len(answers))]
        scores, statuses, seconds = ([row[k] for row in rows] for k in range(3))
        return np.array(scores, dtype=float), np.array(statuses, dtype=int), np.array(seconds, dtype=float)

    def _grade_here(self, answers: list[str | None], golds: list[str], mode: str) -> dict:
        if threading.current_thread() is not threading.main_thread():
            raise PodsBenchError(
                "reward workers=0 grades in the calling thread, which must be the main thread (math-verify's timeouts use signals)"
            )
        results = {}
        with _Grader(self.config.timeout_int, self._gold_cache) as grader:
            for i, (answer, gold) in enumerate(zip(answers, golds)):
                started = time.perf_counter()
                score, status = grader.grade(answer, gold, mode)
                results[i] = (score, status, time.perf_counter() - started)
        return results

    def _chunks(self, answers: list[str | None], golds: list[str], mode: str) -> list[list[tuple]]:
        """About four chunks per worker; items sorted by gold, so a worker sees all (or most) items of
        one gold together and parses that gold once."""
        order = sorted(range(len(answers)), key=lambda i: golds[i])
        size = max(1, min(64, math.ceil(len(order) / (4 * self.config.workers))))
        return [[(i, answers[i], golds[i], mode) for i in order[s : s + size]] for s in range(0, len(order), size)]

    def _grade_completions(self, completions: list[str], golds: list[str]):
        """Per completion: correct if any candidate of the grading mode is (score 1), its status the
        worst of its candidates' unless one was correct, its seconds their sum."""
        extract, mode = GRADING_MODES[self.config.grading]
        candidates = [list(dict.fromkeys(extract(t))) for t in completions]  # distinct, in order
        owner = np.repeat(np.arange(len(completions)), [len(c) for c in candidates])
        flat = [a for c in candidates for a in c]
        scores, statuses, seconds = self.grade(flat, [golds[i] for i in owner], mode)
        correctness = np.zeros(len(completions))
        np.maximum.at(correctness, owner, scores)
        worst = np.zeros(len(completions), dtype=int)
        np.maximum.at(worst, owner, np.array([_SEVERITY[s] for s in statuses], dtype=int))
        status = np.where(correctness > 0, OK, np.array(_BY_SEVERITY)[worst])
        total_seconds = np.zeros(len(completions))
        np.add.at(total_seconds, owner, seconds)
        return correctness, status, total_seconds

    def __call__(self, completions: list[str], golds: list[str]) -> RewardBreakdown:
        if len(completions) != len(golds):
            raise ValueError(f"{len(completions)} completions but {len(golds)} gold answers")
        c = self.config
        correctness, statuses, seconds = self._grade_completions(completions, list(golds))
        format_fn, tag_fn = FORMAT_STYLES[c.format_style]
        fmt = np.array([format_fn(t) for t in completions], dtype=float)
        tags = np.array([tag_fn(t) for t in completions], dtype=float)
        shaping = c.format_weight * fmt + c.tag_weight * tags
        if c.shaping_only_when_wrong:  # 3fc107e:utils/data.py:L244-247, L266-269
            shaping = shaping * (1.0 - correctness)
        total = c.correctness_weight * correctness + shaping
        return RewardBreakdown(
            total=total,
            correctness=correctness,
            format=fmt,
            tags=tags,
            n_timeouts=int(np.isin(statuses, (TIMEOUT, KILLED)).sum()),
            n_errors=int((statuses == ERROR).sum()),
            seconds=seconds,
            n_killed=int((statuses == KILLED).sum()),
        )
