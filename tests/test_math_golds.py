"""MATH training golds: the balanced last \\boxed{...} by default, or the paper's code's truncation at
the first "}" (3fc107e:utils/data.py:L134-140) for exact replication, and how many problems it hits."""

from __future__ import annotations

import pytest

from pods_bench.config import config_from_dict
from pods_bench.errors import PodsBenchError
from pods_bench.models import build_char_tokenizer
from pods_bench.sampling import load_training_prompts
from pods_bench.tasks import load_problems
from pods_bench.tasks.hub import released_math_gold
from tests.tiny_runs import tiny_run


def test_the_released_rule_cuts_at_the_first_closing_brace():
    assert released_math_gold(r"so $\boxed{\frac{1}{2}}$.") == r"\frac{1"
    assert released_math_gold(r"first \boxed{3}, then \boxed{ 7 }") == "7"
    assert released_math_gold(r"the answer is \boxed 5") == ""  # no "\boxed{": their None, never correct


@pytest.mark.parametrize("split, total, affected", [("train", 7500, 1728), ("test", 5000, 1183)])
def test_how_many_math_problems_the_truncation_affects(data_dir, split, total, affected):
    """Reported in docs/fidelity.md: about 23 % of MATH could never be answered right in the paper's runs."""
    problems = load_problems("math", split, data_dir=data_dir)
    differ = [p for p in problems if released_math_gold(p.solution) != p.gold]
    assert (len(problems), len(differ)) == (total, affected)
    assert sum("{" in p.gold for p in differ) >= affected - 2  # nested braces, but for brace-less \boxed 2


def test_training_uses_the_chosen_golds(tmp_path, data_dir):
    tokenizer = build_char_tokenizer()
    settings = dict(task={"name": "math", "limit": 200, "max_prompt_tokens": 100_000}, data_dir=str(data_dir))
    cfg = config_from_dict(tiny_run(tmp_path, **settings))
    balanced, _, _ = load_training_prompts(cfg.task, cfg.data_dir, tokenizer)
    settings["task"]["math_gold"] = "released"
    cfg = config_from_dict(tiny_run(tmp_path, **settings))
    released, _, _ = load_training_prompts(cfg.task, cfg.data_dir, tokenizer)
    assert [p.id for p in balanced] == [p.id for p in released]
    changed = [(b.gold, r.gold) for b, r in zip(balanced, released) if b.gold != r.gold]
    assert changed and all(
        r == released_math_gold(b_sol)
        for (_, r), b_sol in zip(changed, [b.solution for b, r in zip(balanced, released) if b.gold != r.gold])
    )
    with pytest.raises(PodsBenchError, match="task.math_gold: 'released' applies to task math only"):
        config_from_dict(tiny_run(tmp_path, task={"math_gold": "released"}))
