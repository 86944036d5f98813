"""Grading one item in this process: `_Grader` parses and verifies with math-verify (imported on
first use, so that importing this module stays cheap), with statuses OK, TIMEOUT, ERROR and
KILLED; `GRADING_MODES` says which candidate answers of a completion are graded, and `gold_texts`
what they are graded against."""

from __future__ import annotations

import logging
import re

from pods_bench.rewards.extraction import _LLAMA_NUMBER, extract_answer, released_answer_block, released_last_number

# --- grading modes: which candidate answers of a completion are graded against the gold ---------
# A completion is correct if any candidate is equivalent to the gold. Mode "open-r1" grades the whole
# completion with open-r1's own math-verify extraction (`_Grader`, parse mode "open-r1").

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

    def __enter__(self) -> _Grader:
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
