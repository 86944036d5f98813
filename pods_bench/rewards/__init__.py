"""Verifier rewards: math-verify graded correctness plus the paper's format shaping.

    total = correctness_weight * correctness + format_weight * format + tag_weight * tags
    (format and tag terms x (1 - correctness) when `shaping_only_when_wrong`)

- correctness (0 or 1): with grading mode "pods-bench" (the default), the answer extracted from the
  completion (`extract_answer`: the last `<answer>...</answer>` block, else the last `\\boxed{}`,
  else the last number) is equivalent to the gold answer according to math-verify
  (`\\frac{1}{2}` = 0.5, `1,000` = 1000, `$72` = 72). The other modes (`GRADING_MODES`) are the
  extraction rules of the paper's own code, graded by math-verify too; named reward recipes
  (recipes.py) choose one.
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

Where each part lives (pods_bench/rewards/):

    extraction.py  answer extraction: `extract_answer`, `last_boxed`, `answer_block`, the authors'
                   rules `released_answer_block` / `released_last_number`; text only
    shaping.py     format styles: `format_score`, `tag_score`, their open-r1 variants,
                   `FORMAT_STYLES`, the evaluation's `format_correct`
    grading.py     one item in this process: `_Grader` (math-verify), statuses OK / TIMEOUT / ERROR /
                   KILLED, `GRADING_MODES`, `gold_texts`
    pool.py        the killable worker pool (`_GraderPool`, the worker's `_worker_main`)
    function.py    `RewardConfig`, `RewardBreakdown`, `RewardFunction`
    recipes.py     named reward recipes (`REWARD_RECIPES`, `reward.recipe`)

The names below are importable from `pods_bench.rewards`. Each submodule is imported on first use,
so importing one of them (tasks/hub.py imports extraction) loads neither the pool nor math-verify.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# submodule -> the names it exports here
_EXPORTS = {
    "extraction": (
        "answer_block",
        "braces_balance",
        "extract_answer",
        "last_boxed",
        "last_number",
        "released_answer_block",
        "released_last_number",
        "_LLAMA_NUMBER",  # analysis/grading_agreement.py
    ),
    "shaping": (
        "FORMAT_STYLES",
        "format_correct",
        "format_score",
        "open_r1_format_score",
        "open_r1_tag_score",
        "tag_score",
        "_format_span",  # tests/test_rewards.py checks it against the regex
    ),
    "grading": ("ERROR", "GRADING_MODES", "KILLED", "OK", "TIMEOUT", "gold_texts", "_Grader"),
    "function": ("RewardBreakdown", "RewardConfig", "RewardFunction"),
    "recipes": ("RECIPE_FIELDS", "REWARD_RECIPES", "RewardRecipe"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(name for name in _MODULE_OF if not name.startswith("_"))


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))


if TYPE_CHECKING:  # for type checkers and editors, which do not run __getattr__
    from pods_bench.rewards.extraction import (
        _LLAMA_NUMBER,
        answer_block,
        braces_balance,
        extract_answer,
        last_boxed,
        last_number,
        released_answer_block,
        released_last_number,
    )
    from pods_bench.rewards.function import RewardBreakdown, RewardConfig, RewardFunction
    from pods_bench.rewards.grading import ERROR, GRADING_MODES, KILLED, OK, TIMEOUT, _Grader, gold_texts
    from pods_bench.rewards.recipes import RECIPE_FIELDS, REWARD_RECIPES, RewardRecipe
    from pods_bench.rewards.shaping import (
        FORMAT_STYLES,
        _format_span,
        format_correct,
        format_score,
        open_r1_format_score,
        open_r1_tag_score,
        tag_score,
    )
