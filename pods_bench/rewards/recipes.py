"""Reward recipes: the rewards the paper's runs were trained with, by name (`reward.recipe`).

A recipe fixes every part of the reward: the weights of correctness, format and tag terms, the
format style, whether the shaping terms count only for wrong answers, and how correctness is
graded (`GRADING_MODES` in pods_bench/rewards/grading.py; math-verify is the engine of every mode). Each
cites the lines of the authors' code (github.com/YixuanEvenXu/pods) it follows; docs/fidelity.md
lists where pods-bench's grading still differs from theirs.

`reward.recipe: custom` (the default) takes the weights and modes from the other `reward.*` keys.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardRecipe:
    description: str
    source: str  # commit:path:lines of the authors' code
    correctness_weight: float
    format_weight: float
    tag_weight: float
    format_style: str  # pods_bench.rewards.FORMAT_STYLES
    shaping_only_when_wrong: bool  # format and tag terms are 0 for a correct answer
    grading: str  # pods_bench.rewards.GRADING_MODES


RECIPE_FIELDS = (
    "correctness_weight",
    "format_weight",
    "tag_weight",
    "format_style",
    "shaping_only_when_wrong",
    "grading",
)

REWARD_RECIPES: dict[str, RewardRecipe] = {
    # 1.0 if correct, else max(0, 0.1 - 0.001 x chars outside the think/answer span) + 0.025 per tag
    # seen exactly once: our 0.1 x format_score + 0.1 x tag_score, gated
    "pods-gsm8k": RewardRecipe(
        "single-GPU Qwen2.5 GSM8K runs: 1 if correct, else 0.1 x format + 0.1 x tags",
        "3fc107e:train.py:L95-97; utils/data.py:L52-62,L239-269; trainer/maxvargrpo_trainer.py:L497",
        1.0,
        0.1,
        0.1,
        "pods",
        True,
        "released-1gpu",
    ),
    # "MATH-NF": no format reward, correctness alone (train.py adds the shaping terms for gsm8k only)
    "pods-math-nf": RewardRecipe(
        "single-GPU Qwen2.5 MATH runs ('MATH-NF'): correctness alone",
        "3fc107e:train.py:L95-97; utils/data.py:L239-242",
        1.0,
        0.0,
        0.0,
        "pods",
        False,
        "released-1gpu",
    ),
    # correctness + 0.01 x format_score + 0.01 x (0.25 per tag), ungated, for every dataset; the
    # last-number rule reads [\d.,]+. (The next commit, 187f43b, set both weights to 0.1; the Llama
    # results were committed with 0c453d2.)
    "pods-llama": RewardRecipe(
        "single-GPU Llama-3.2 GSM8K runs: correctness + 0.01 x format + 0.01 x tags, ungated",
        "0c453d2:train.py:L97; utils/data.py:L60,L74,L260,L270-283",
        1.0,
        0.01,
        0.01,
        "pods",
        False,
        "released-1gpu-llama",
    ),
    # open-r1's accuracy_reward (LaTeX answers only, gold parsed from the full solution), format_reward
    # (strict think/answer layout, 1/0) and tag_count_reward (0.25 per tag), weights 1, 1, 1
    "open-r1": RewardRecipe(
        "8-GPU runs: open-r1 accuracy + format + tag_count, weights 1, 1, 1",
        "9459b96:open-r1/src/open_r1/rewards.py:L96-168; open-r1/recipes/Qwen2.5-3B-Instruct/config_pods.yaml:L44-51",
        1.0,
        1.0,
        1.0,
        "open-r1",
        False,
        "open-r1",
    ),
}
