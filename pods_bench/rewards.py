"""Verifier rewards: math-verify graded correctness plus the paper's format shaping.

    total = correctness_weight * correctness + format_weight * format + tag_weight * tags
    (format and tag terms x (1 - correctness) when `shaping_only_when_wrong`)

- correctness (0 or 1): with grading mode "pods-bench" (the default), the answer extracted from the
  completion (`extract_answer`: the last `<answer>...</answer>` block, else the last `\\boxed{}`,
  else the last number) is equivalent to the gold answer according to math-verify
  (`\\frac{1}{2}` = 0.5, `1,000` = 1000, `$72` = 72). The other modes (`GRADING_MODES`) are the
  extraction rules of the paper's own code, graded by math-verify too; named reward recipes
  (pods_bench/reward_recipes.py) choose one.
  math-verify reads one value from an answer and drops what it cannot use around it: as
  `72 \\text{ dollars}` is 72, so are `x \\not= 72`, `\\foo 72^{2}` and 72 with a unicode superscript.
  Such answers spell out the gold; among ~2,000 adversarial completions
  (tests/test_rewards_adversarial.py) none passes without it. Only ASCII digits are read: full-width
  digits are not, nor is a number with a character glued in front (`x72`, or even an invisible
  right-to-left mark).
- format in [0, 1] and tags in [0, 1]: the shaping terms of the official PODS code
  (github.com/YixuanEvenXu/pods). Default style "pods", its single-GPU training code (`utils/data.py`:
  `format_reward_func` = 0.1 x `format_score`, `xmlcount_reward_func` = 0.1 x `tag_score`, so weights
  0.1 and 0.1); style "open-r1", its multi-GPU recipes (`format_reward` and `tag_count_reward`,
  weights 1 and 1 in their config).

Every component is always computed and returned raw in `RewardBreakdown` so the trainer can log it;
a weight of 0 only removes the component from `total`.

math-verify enforces its timeouts with SIGALRM, which only works in a process's main thread, and a
long C-level sympy/bigint operation can outlive the alarm. So grading runs in worker processes
(`workers` of them), each with math-verify's own timeouts, and the parent kills any worker that is
still busy with one item after `deadline_s`, replaces it, and scores the item 0. A timeout or an
exception never escapes: it scores 0 and is counted (`n_timeouts`, of which `n_killed` by the hard
deadline, and `n_errors`); `seconds` holds each item's grading time.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import re
import signal
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field, fields
from multiprocessing.connection import wait as wait_for_connections

import numpy as np

from pods_bench.errors import PodsBenchError

# --- answer extraction ---------------------------------------------------------------------------
# Hand-written scans rather than regexes with `.*?`: completions are untrusted and can be megabytes
# long, and a lazy regex over many unclosed tags is quadratic. Everything below is linear.

_BOXED = re.compile(r"\\boxed(?:\s*(\{)|\s+([^\s${}\\]+))")  # \boxed{...} or the brace-less \boxed 2
_BRACE = re.compile(r"(?<!\\)[{}]")  # group braces; \{ and \} are literal set braces in LaTeX
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")  # 72, -3.5, 1,000


def _matching_braces(text: str) -> dict[int, int]:
    """Position of each group-opening `{` -> position of its closing `}` (unclosed ones absent)."""
    match, stack = {}, []
    for m in _BRACE.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            match[stack.pop()] = m.start()
    return match


def braces_balance(text: str) -> bool:
    depth = 0
    for m in _BRACE.finditer(text):
        depth += 1 if m.group() == "{" else -1
        if depth < 0:
            return False
    return depth == 0


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` (balanced braces, so `\\boxed{\\frac{a}{b}}` gives
    `\\frac{a}{b}`), or of a brace-less `\\boxed 2` (two MATH train solutions use that form).
    A `\\boxed{` whose braces never close (a truncated completion) is skipped. None if there is none."""
    found = list(_BOXED.finditer(text))
    if not found:
        return None
    closing = _matching_braces(text) if any(m.group(1) for m in found) else {}
    for m in reversed(found):
        if m.group(2) is not None:
            return m.group(2)
        end = closing.get(m.start(1))
        if end is not None:
            return text[m.end(1) : end].strip()
    return None


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def answer_block(text: str) -> str | None:
    """Content of the last complete `<answer>...</answer>` block (None if there is none)."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if start < 0:
        return None
    return text[start + len("<answer>") : end].strip()


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion: the `<answer>` block (its last `\\boxed{}` if it has one),
    else the last `\\boxed{}`, else the last number. None (or empty) answers are graded wrong."""
    block = answer_block(completion)
    if block:
        return last_boxed(block) or block
    boxed = last_boxed(completion)
    if boxed:
        return boxed
    return last_number(completion)


# --- grading modes: which candidate answers of a completion are graded against the gold ---------
# A completion is correct if any candidate is equivalent to the gold. Mode "open-r1" grades the whole
# completion with open-r1's own math-verify extraction (`_Grader`, parse mode "open-r1").

_INTEGER = re.compile(r"\d+")  # 3fc107e:utils/data.py:L45-50
_LLAMA_NUMBER = re.compile(r"[\d\.\,]+")  # 0c453d2:utils/data.py:L60


def released_answer_block(text: str) -> str:
    """3fc107e:utils/data.py:L39-43: `text.split("<answer>")[-1].split("</answer>")[0].strip()` (the
    whole text when there is no <answer> tag)."""
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def released_last_number(text: str, pattern: re.Pattern = _INTEGER) -> str:
    """The last match of `pattern`, or "-1" if there is none (3fc107e:utils/data.py:L45-50)."""
    numbers = pattern.findall(text)
    return numbers[-1] if numbers else "-1"


# mode -> (candidates of a completion, how the worker parses them)
GRADING_MODES = {
    # pods-bench's rule: one answer, the <answer> block's (or its \boxed{}), else \boxed{}, else the last number
    "pods-bench": (lambda text: [extract_answer(text)], "answer"),
    # the single-GPU code: any of whole text, <answer> block, last integer (3fc107e:utils/data.py:L52-55)
    "released-1gpu": (lambda text: [text, released_answer_block(text), released_last_number(text)], "answer"),
    # the Llama runs: the same with the last number read as [\d.,]+ (0c453d2:utils/data.py:L60)
    "released-1gpu-llama": (
        lambda text: [text, released_answer_block(text), released_last_number(text, _LLAMA_NUMBER)],
        "answer",
    ),
    # open-r1's accuracy_reward: LaTeX answers only, read from the whole completion; the gold parsed
    # from the full solution text (9459b96:open-r1/src/open_r1/rewards.py:L96-138)
    "open-r1": (lambda text: [text], "open-r1"),
}


def gold_texts(problems, grading: str) -> list[str]:
    """What each problem's completions are graded against: the gold answer, or for open-r1 grading
    the full reference solution (GSM8K's `answer` column) when the task has one."""
    if grading == "open-r1":
        return [p.solution or p.gold for p in problems]
    return [p.gold for p in problems]


# --- format shaping ----------------------------------------------------------------------------------
# Two styles, both from the official PODS repository: "pods", the single-GPU training code
# (utils/data.py), and "open-r1", the multi-GPU recipes (open-r1/src/open_r1/rewards.py).

_THINK, _THINK_END, _ANSWER, _ANSWER_END = "<think>", "</think>", "<answer>", "</answer>"
_MIDDLE = re.compile(r"</think>[ \n]?<answer>")


def _format_span(text: str) -> tuple[int, int] | None:
    """Span of `re.search(r"<think>.*</think>[ \\n]?<answer>.*</answer>", text, re.DOTALL)` in linear
    time. The greedy regex starts at the first `<think>` and ends at the last `</answer>`; a match
    exists iff some `</think>[ \\n]?<answer>` lies between them (the earliest one is the best witness).
    tests/test_rewards.py checks this equals the regex on generated strings."""
    start = text.find(_THINK)
    if start < 0:
        return None
    middle = _MIDDLE.search(text, start + len(_THINK))
    end = text.rfind(_ANSWER_END)
    if middle is None or end < middle.end():
        return None
    return start, end + len(_ANSWER_END)


def format_score(completion: str) -> float:
    """1 for `<think>...</think><answer>...</answer>` (one optional space or newline between the
    blocks), minus 0.01 per character outside that span, floored at 0; 0 without that structure.
    (Official: `format_score`; the paper's reward is 0.1 x this.)"""
    span = _format_span(completion)
    if span is None:
        return 0.0
    outside = len(completion) - (span[1] - span[0])
    return max(0.0, 1.0 - 0.01 * outside)


def tag_score(completion: str) -> float:
    """0.25 for each of `<think>`, `</think>`, `<answer>`, `</answer>` that occurs exactly once.
    (Official: `count_xml`, which counts the bare tags; the paper's reward is 0.1 x this.)"""
    return 0.25 * sum(completion.count(tag) == 1 for tag in (_THINK, _THINK_END, _ANSWER, _ANSWER_END))


_OPEN_R1_MIDDLE = "\n</think>\n<answer>\n"
_OPEN_R1_END = re.compile(r"\n</answer>(?=\n|\Z)")
_OPEN_R1_TAGS = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")


def open_r1_format_score(completion: str) -> float:
    """1 if the completion is `<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>` (official
    `format_reward`: `re.match(r"^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$",
    re.DOTALL | re.MULTILINE)`, so text may follow on later lines), else 0. Linear time: the earliest
    middle leaves the most room for the end."""
    if not completion.startswith("<think>\n"):
        return 0.0
    middle = completion.find(_OPEN_R1_MIDDLE, len("<think>\n"))
    if middle < 0:
        return 0.0
    return float(_OPEN_R1_END.search(completion, middle + len(_OPEN_R1_MIDDLE)) is not None)


def open_r1_tag_score(completion: str) -> float:
    """0.25 for each of `<think>\\n`, `\\n</think>\\n`, `\\n<answer>\\n`, `\\n</answer>` that
    occurs exactly once (official `tag_count_reward`)."""
    return 0.25 * sum(completion.count(tag) == 1 for tag in _OPEN_R1_TAGS)


# style -> (format score, tag score), both in [0, 1]
FORMAT_STYLES = {
    "pods": (format_score, tag_score),
    "open-r1": (open_r1_format_score, open_r1_tag_score),
}


# what may follow the last </answer> in `[ \n]?$` (Python's `$` also matches before a final newline)
_FORMAT_TAILS = ("", " ", "\n", " \n", "\n\n")


def format_correct(completion: str) -> bool:
    """The evaluation's format check (official `format_correct`): the whole completion is
    `<think>...</think><answer>...</answer>`, with at most one space or newline at the start, between
    the blocks and at the end. Same as `re.match(r"^[ \n]?<think>.*</think>[ \n]?<answer>.*</answer>[ \n]?$",
    completion, re.DOTALL)`, in linear time."""
    lead = 1 if completion[:1] in (" ", "\n") else 0
    span = _format_span(completion)
    return span is not None and span[0] == lead and completion[span[1] :] in _FORMAT_TAILS


# --- grading one item (runs in a worker process, or in the main thread with workers=0) -----------

OK, TIMEOUT, ERROR, KILLED = 0, 1, 2, 3  # KILLED: a timeout enforced by killing the worker
_BY_SEVERITY = (OK, ERROR, TIMEOUT, KILLED)  # a completion's status: the worst of its candidates'
_SEVERITY = {status: rank for rank, status in enumerate(_BY_SEVERITY)}
_MAX_COMPLETION_CHARS = 50_000  # whole completions graded by open-r1's rule; longer ones score 0

# math-verify reports timeouts and the exceptions it swallows only through its logger; these are
# the message prefixes of math-verify 0.9 (the fuzz test fails if timeouts stop being seen).
_TIMEOUT_PREFIX = "Timeout during"
_ERROR_PREFIX = "Error"
_MATH_DELIMITER = re.compile(r"(?<!\\)\$|\\\(|\\\[")  # an unescaped $, \( or \[


class _MathVerifyEvents(logging.Handler):
    """Counts math-verify's timeout and error reports."""

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.timeouts = self.errors = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = str(record.msg)
        if message.startswith(_TIMEOUT_PREFIX):
            self.timeouts += 1
        elif message.startswith(_ERROR_PREFIX):
            self.errors += 1


class _Grader:
    """Grades (answer, gold) pairs in this process. While open, math-verify's log records go to a
    counter and nowhere else (its timeout warnings would print megabyte-long completions)."""

    def __init__(self, timeout: int, gold_cache: dict | None = None):
        self.timeout = timeout
        self.gold_cache = {} if gold_cache is None else gold_cache  # gold text -> parsed gold
        self.events = _MathVerifyEvents()
        self._logger = logging.getLogger("math_verify")

    def __enter__(self) -> "_Grader":
        self._saved = self._logger.level, self._logger.propagate
        self._logger.addHandler(self.events)
        self._logger.setLevel(logging.DEBUG)
        self._logger.propagate = False
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self.events)
        self._logger.setLevel(self._saved[0])
        self._logger.propagate = self._saved[1]

    def _parse(self, text: str) -> list:
        """Parse with math-verify, which only reads LaTeX inside math delimiters (a bare `\\dfrac12`
        parses to nothing): text without delimiters is parsed wrapped in `$...$`, text with its own
        (`is $\\frac12$.`) as it is; the other way is the fallback if that finds nothing, unless it
        timed out."""
        from math_verify import parse

        wrapped = f"${text}$"
        for attempt in (text, wrapped) if _MATH_DELIMITER.search(text) else (wrapped, text):
            parsed = parse(attempt, parsing_timeout=self.timeout)
            if parsed or self.events.timeouts:
                return parsed
        return []

    def _parse_open_r1(self, text: str, gold: bool) -> list:
        """open-r1's parsing (9459b96:open-r1/src/open_r1/rewards.py): the gold with math-verify's
        default extraction, first match (L101-104); the completion LaTeX-only, boxed answers first,
        nothing read without an anchor (L107-125)."""
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import LatexExtractionConfig, parse

        if gold:
            return parse(text, extraction_mode="first_match", parsing_timeout=self.timeout)
        config = LatexExtractionConfig(
            normalization_config=NormalizationConfig(
                nits=False, malformed_operators=False, basic_latex=True, equations=True, boxed="all", units=True
            ),
            boxed_match_priority=0,
            try_extract_without_anchor=False,
        )
        return parse(text, extraction_config=[config], extraction_mode="first_match", parsing_timeout=self.timeout)

    def grade(self, answer: str | None, gold: str, mode: str = "answer") -> tuple[float, int]:
        """(score, status) of one candidate answer against one gold answer. `mode` "answer": both
        parsed by `_parse`; "open-r1": both as open-r1 parsed them (`_parse_open_r1`)."""
        from math_verify import verify

        if not answer or not gold:
            return 0.0, OK
        self.events.timeouts = self.events.errors = 0
        parse = self._parse if mode == "answer" else (lambda text, gold=False: self._parse_open_r1(text, gold))
        try:
            if (mode, gold) not in self.gold_cache:  # a gold that timed out stays cached as unparseable
                if len(self.gold_cache) >= 10_000:  # bound the memory of a long-lived process
                    self.gold_cache.clear()
                self.gold_cache[mode, gold] = parse(gold) if mode == "answer" else parse(gold, gold=True)
            correct = verify(self.gold_cache[mode, gold], parse(answer), timeout_seconds=self.timeout)
        except Exception:  # math-verify swallows its own errors; anything else is still just a 0
            return 0.0, ERROR
        if correct:  # a timeout or error on another candidate pair did not matter
            return 1.0, OK
        return 0.0, TIMEOUT if self.events.timeouts else ERROR if self.events.errors else OK


def _limit_address_space(extra_mb: int) -> None:
    """Let this process allocate at most `extra_mb` more address space, so that a runaway bigint
    becomes a MemoryError (scored 0) rather than a machine-wide out-of-memory. Relative to the current
    size because a forked worker inherits its parent's (possibly huge) mappings. Linux only."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[0])
    except (ImportError, OSError):
        return
    limit = pages * os.sysconf("SC_PAGE_SIZE") + extra_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _worker_main(conn, timeout: int, memory_limit_mb: int | None) -> None:
    """Worker process: receive chunks of (index, answer, gold, mode), send back one
    (index, score, status, seconds) per item as soon as it is graded; exit on None or a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    if memory_limit_mb:
        _limit_address_space(memory_limit_mb)
    with _Grader(timeout) as grader:
        # The first parse in a process pays ~1 s of lazy imports and parser set-up: pay it before
        # reporting ready, not on the clock of the first item.
        grader.grade(r"\frac{1}{2}", "0.5")
        conn.send("ready")
        while True:
            try:
                chunk = conn.recv()
            except (EOFError, OSError):
                return
            if chunk is None:
                return
            for index, answer, gold, mode in chunk:
                started = time.perf_counter()
                try:
                    score, status = grader.grade(answer, gold, mode)
                except BaseException:  # e.g. a TimeoutException raised outside math-verify's own handlers
                    score, status = 0.0, TIMEOUT
                conn.send((index, score, status, time.perf_counter() - started))


# --- the worker pool ---------------------------------------------------------------------------


_STARTUP_TIMEOUT_S = 120.0


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: mp.connection.Connection
    pending: deque = field(default_factory=deque)  # items sent and not yet answered, in order
    started: float = 0.0  # when the item at pending[0] started (monotonic)


class _GraderPool:
    """`workers` grading processes with a hard per-item deadline: a worker still on one item after
    `deadline_s` is killed and replaced. (concurrent.futures cannot kill one task's process, hence
    this small pool.)"""

    def __init__(self, workers: int, start_method: str, timeout: int, memory_limit_mb: int | None):
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # workers fork from a server that has already imported math-verify
            self._ctx.set_forkserver_preload(["pods_bench.rewards"])
        self._args = (timeout, memory_limit_mb)
        self._workers = [self._start_worker() for _ in range(workers)]
        for w in self._workers:
            self._await_ready(w)
        self.restarts = 0

    def _start_worker(self) -> _Worker:
        parent_end, child_end = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main, args=(child_end, *self._args), daemon=True, name="pods-bench-grader")
        process.start()
        child_end.close()
        return _Worker(process, parent_end)

    @staticmethod
    def _await_ready(w: _Worker) -> None:
        try:
            ready = w.conn.poll(_STARTUP_TIMEOUT_S) and w.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            w.process.kill()
            raise PodsBenchError(
                "a reward grading process failed to start; with start method 'forkserver' or 'spawn' the "
                "main script must guard its code with `if __name__ == '__main__':`"
            )

    def _replace(self, worker: _Worker) -> _Worker:
        worker.process.kill()
        worker.process.join()
        worker.conn.close()
        fresh = self._start_worker()
        self._await_ready(fresh)
        self._workers[self._workers.index(worker)] = fresh
        self.restarts += 1
        return fresh

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def grade(self, chunks: list[list[tuple]], deadline_s: float) -> dict[int, tuple[float, int, float]]:
        """Grade chunks of (index, answer, gold, mode): {index: (score, status, seconds)}."""
        items = {item[0]: item for chunk in chunks for item in chunk}
        queue, results = deque(chunks), {}
        while queue or any(w.pending for w in self._workers):
            for w in self._workers:
                if not w.pending and queue:
                    self._send(w, queue.popleft())
            busy = [w for w in self._workers if w.pending]
            next_deadline = min(w.started for w in busy) + deadline_s
            ready = wait_for_connections([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            for w in busy:
                try:
                    while w.conn in ready and w.pending and w.conn.poll():
                        _index, score, status, seconds = w.conn.recv()  # in the order sent
                        results[w.pending.popleft()] = (score, status, seconds)
                        w.started = time.monotonic()
                except (EOFError, OSError):  # the worker died (e.g. killed by the OS)
                    self._lose_current_item(w, ERROR, items, queue, results)
                    continue
                if w.pending and time.monotonic() - w.started > deadline_s:
                    self._lose_current_item(w, KILLED, items, queue, results)
        return results

    def _send(self, w: _Worker, chunk: list[tuple]) -> None:
        try:
            w.conn.send(chunk)
        except OSError:  # died while idle: replace it and send again
            w = self._replace(w)
            w.conn.send(chunk)
        w.pending.extend(item[0] for item in chunk)
        w.started = time.monotonic()

    def _lose_current_item(self, w: _Worker, status: int, items: dict, queue: deque, results: dict) -> None:
        """Kill and replace the worker; its current item scores 0 with `status`, the rest of its
        chunk goes back to the front of the queue."""
        results[w.pending.popleft()] = (0.0, status, time.monotonic() - w.started)
        if w.pending:
            queue.appendleft([items[i] for i in w.pending])
        self._replace(w)

    def close(self) -> None:
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in self._workers:
            w.process.join(timeout=2)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()
        self._workers = []


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
    # a named recipe (pods_bench/reward_recipes.py) fixes the weights, style, gating and grading above;
    # "custom": the keys as given
    recipe: str = "custom"

    def __post_init__(self):
        from pods_bench.reward_recipes import RECIPE_FIELDS, REWARD_RECIPES

        if self.recipe != "custom":
            if self.recipe not in REWARD_RECIPES:
                raise PodsBenchError(f"reward recipe {self.recipe!r} is not one of custom, {', '.join(REWARD_RECIPES)}")
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
            raise PodsBenchError(f"reward start_method {self.start_method!r} is not one of {mp.get_all_start_methods()}")

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

    def __enter__(self) -> "RewardFunction":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- grading
    def grade(self, answers: list[str | None], golds: list[str], mode: str = "answer") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
