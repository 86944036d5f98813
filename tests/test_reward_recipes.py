"""Reward recipes: the rewards of the paper's runs by name, each checked against the authors'
formulas transcribed here from their code (github.com/YixuanEvenXu/pods), and the grading modes that
follow their answer-extraction rules with math-verify as the engine."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pods_bench.config import config_from_dict
from pods_bench.errors import PodsBenchError
from pods_bench.rewards import RewardConfig, RewardFunction, gold_texts
from pods_bench.rewards.recipes import REWARD_RECIPES
from pods_bench.tasks import Problem
from tests.tiny_runs import tiny_run

GSM8K_SOLUTION = (
    "She eats 3 and bakes with 4, so 16 - 3 - 4 = <<16-3-4=9>>9 are left.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18"
)
COMPLETIONS = [
    "<think>\n16-3-4=9, 9*2=18\n</think>\n<answer>\n18\n</answer>",  # correct, well formed
    "<think>\n16-3-4=9, 9*2=18\n</think>\n<answer>\n17\n</answer>",  # wrong, well formed
    "<think>16-3-4=9</think> <answer>17</answer> and some trailing words",  # wrong, text outside the span
    "The answer is 18.",  # correct by the last number, no format
    "<think>\nso\n</think>\n<answer>\n$18$\n</answer>",  # correct, LaTeX
    "<think>\nso\n</think>\n<answer>\n\\boxed{18}\n</answer>\n",  # correct, boxed
    "<answer>eighteen</answer> from 9 eggs at 2 dollars: 18",  # the answer block is prose, the last number is right
    "no idea",
]


def official_format_score(text: str, scale: float) -> float:
    """3fc107e:utils/data.py:L57-62 (scale 0.1) and 0c453d2:utils/data.py:L74 (scale 1)."""
    match = re.search(r"<think>.*</think>[ \n]?<answer>.*</answer>", text, flags=re.DOTALL)
    return max(0.0, scale - scale * 0.01 * (len(text) - len(match.group(0)))) if match else 0.0


def official_tag_count(text: str, per_tag: float) -> float:
    """3fc107e:utils/data.py:L254-264 (0.025 per tag) and 0c453d2:utils/data.py:L270-277 (0.25)."""
    return per_tag * sum(text.count(tag) == 1 for tag in ("<think>", "</think>", "<answer>", "</answer>"))


def graded(recipe: str, completions=COMPLETIONS, gold: str = "18", solution: str | None = GSM8K_SOLUTION):
    config = RewardConfig(recipe=recipe, workers=0)
    problems = [Problem("p", "q", gold, solution)] * len(completions)
    with RewardFunction(config) as reward:
        return reward(list(completions), gold_texts(problems, config.grading))


def test_pods_gsm8k_shaping_counts_only_for_wrong_answers():
    out = graded("pods-gsm8k")
    expected = [
        1.0 if c else official_format_score(t, 0.1) + official_tag_count(t, 0.025)
        for t, c in zip(COMPLETIONS, out.correctness)
    ]
    assert out.total == pytest.approx(expected, abs=1e-12)
    assert list(out.correctness) == [1, 0, 0, 1, 1, 1, 1, 0]
    assert out.total[0] == 1.0 and out.total[1] == pytest.approx(0.2)  # the ungated form would give 1.2 / 0.2


def test_pods_math_nf_is_correctness_alone():
    out = graded("pods-math-nf")
    assert np.array_equal(out.total, out.correctness)


def test_pods_llama_is_ungated_with_weights_001():
    out = graded("pods-llama")
    expected = [
        c + 0.01 * official_format_score(t, 1.0) + 0.01 * official_tag_count(t, 0.25)
        for t, c in zip(COMPLETIONS, out.correctness)
    ]
    assert out.total == pytest.approx(expected, abs=1e-12)
    assert out.total[0] == pytest.approx(1.02)


def test_open_r1_reads_latex_answers_only_against_the_full_solution():
    out = graded("open-r1")
    # a bare number is not a LaTeX answer (open-r1 rewards.py: try_extract_without_anchor=False)
    assert list(out.correctness) == [0, 0, 0, 0, 1, 1, 0, 0]
    assert list(out.format) == [1, 1, 0, 0, 1, 1, 0, 0] and out.total[4] == 3.0
    # the gold is what math-verify reads first from GSM8K's whole solution
    assert graded("open-r1", [COMPLETIONS[4]], gold="17", solution=GSM8K_SOLUTION).correctness[0] == 1


def test_released_single_gpu_grading_accepts_any_of_three_candidates():
    """Whole text, <answer> block (split, not regex) or last integer (3fc107e:utils/data.py:L39-55):
    the prose answer block of completion 6 fails, its last number passes; pods-bench's own rule reads
    only the answer block there."""
    released = graded("pods-gsm8k").correctness
    with RewardFunction(RewardConfig(workers=0)) as reward:  # custom recipe: grading pods-bench
        ours = reward(COMPLETIONS, ["18"] * len(COMPLETIONS)).correctness
    assert released[6] == 1 and ours[6] == 0
    # the official quirk: no digit at all reads as "-1"
    assert graded("pods-gsm8k", ["no digits here"], gold="-1").correctness[0] == 1
    # the Llama rule reads decimals: 2.5 is the last number, where \d+ would give 5
    assert graded("pods-llama", ["it is 2.5"], gold="2.5").correctness[0] == 1
    assert graded("pods-gsm8k", ["it is 2.5"], gold="2.5").correctness[0] == 0


def test_grading_modes_work_in_the_process_pool_too():
    config = RewardConfig(recipe="open-r1", workers=1)
    problems = [Problem("p", "q", "18", GSM8K_SOLUTION)] * len(COMPLETIONS)
    with RewardFunction(config) as reward:
        pooled = reward(COMPLETIONS, gold_texts(problems, config.grading))
    assert np.array_equal(pooled.total, graded("open-r1").total)


def test_a_recipe_sets_its_keys_and_refuses_conflicting_ones(tmp_path):
    cfg = config_from_dict(tiny_run(tmp_path, reward={"recipe": "pods-gsm8k", "workers": 0}))
    recipe = REWARD_RECIPES["pods-gsm8k"]
    assert (cfg.reward.format_weight, cfg.reward.shaping_only_when_wrong, cfg.reward.grading) == (
        recipe.format_weight,
        True,
        "released-1gpu",
    )
    # run.json's resolved config reads back (resume) although it now spells the recipe's values out
    assert config_from_dict(cfg.to_dict()).reward == cfg.reward
    with pytest.raises(PodsBenchError, match="reward format_weight is set by recipe 'pods-gsm8k'"):
        config_from_dict(tiny_run(tmp_path, reward={"recipe": "pods-gsm8k", "format_weight": 0.5}))
    with pytest.raises(PodsBenchError, match="reward recipe 'paper' is not one of custom, pods-gsm8k"):
        config_from_dict(tiny_run(tmp_path, reward={"recipe": "paper"}))
    with pytest.raises(PodsBenchError, match="reward grading 'exact' is not one of pods-bench"):
        config_from_dict(tiny_run(tmp_path, reward={"grading": "exact"}))
