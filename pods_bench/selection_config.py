"""The config section `selection` (pods_bench/selection.py applies it): a module of its own, below
both the config, which nests it in TrainConfig, and the selection rules, which are typed by it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pods_bench.errors import require
from pods_bench.plugins import PluginChoice


@dataclass
class SelectionConfig(PluginChoice):
    """Which of each group's rollouts train (pods_bench/selection.py), and their advantages. A rule's
    own settings are the section selection.<rule>, kept as given (`sections`) and typed by the
    rule's settings dataclass when the config is checked and when the rule runs
    (`SELECTION_RULES.typed_settings(cfg.selection)`, pods_bench/plugins.py)."""

    choice_field = "rule"
    rule: str = "max_variance"  # a key of pods_bench.selection.SELECTION_RULES; "all" with m == n is GRPO
    n: int = 16  # rollouts generated per group (per prompt unless groups_per_prompt > 1)
    m: int = 4  # rollouts trained on per group
    # independent groups of n rollouts per prompt, each selected n -> m and normalised on its own
    # (the paper's 8-GPU runs: gradient accumulation over G groups of the same prompt); n and m are
    # per group, so a step samples P x G x n rollouts and trains on P x G x m
    groups_per_prompt: int = 1
    filter_uniform_groups: bool = False  # DAPO: drop prompts whose n rewards are all equal
    scale_advantage_by_std: bool = True  # GRPO's (r - mean) / (std + eps); False: r - mean (Dr. GRPO)
    # advantages normalised over the kept m (PODS), or over all n of the group and left as they are
    # for the kept ones (CPPO: lzhxmu/CPPO@52faeb3 prunes after computing them over the whole group)
    advantage_over: Literal["kept", "all"] = "kept"
    # "group": m of each group's n (every rule); "batch": CPPO's batch-level pruning, the groups x m
    # rollouts of this process's batch with the largest |advantage| (rule max_abs_advantage, advantage_over all)
    scope: Literal["group", "batch"] = "group"
    sections: dict[str, Any] = field(default_factory=dict)  # rule -> its section, as given

    def __post_init__(self):
        require(
            self.n >= 2,
            f"config key selection.n must be >= 2 (advantages compare rollouts of one prompt), got {self.n}",
        )
        require(
            self.groups_per_prompt >= 1,
            f"config key selection.groups_per_prompt must be >= 1, got {self.groups_per_prompt}",
        )
        require(self.m <= self.n, f"config key selection.m ({self.m}) must be <= selection.n ({self.n})")
        require(
            self.m >= 2,
            f"config key selection.m must be >= 2 (advantages are normalised over the m kept), got {self.m}",
        )
