"""Answer extraction: the final answer of a completion (`extract_answer`), and the authors'
extraction rules that grading modes use (`released_answer_block`, `released_last_number`).
Pure text functions: no math-verify and no processes (tasks/hub.py reads MATH golds with
`last_boxed`)."""

from __future__ import annotations

import re

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


# --- the authors' extraction rules (grading.py's GRADING_MODES use them) -----------------------

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
