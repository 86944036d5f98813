"""Format shaping: the format and tag scores of the official PODS code (styles "pods" and
"open-r1", `FORMAT_STYLES`) and the evaluation's format check (`format_correct`)."""

from __future__ import annotations

import re

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
