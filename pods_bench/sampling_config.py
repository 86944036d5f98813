"""The sampling parameters (the config's `sampling` section, and every engine's `generate` argument):
a module of its own, below both the config and the rollout engines (pods_bench/engines/)."""

from __future__ import annotations

from dataclasses import dataclass

from pods_bench.errors import PodsBenchError


@dataclass(frozen=True)
class SamplingConfig:
    """Every parameter that shapes the sampling distribution, set explicitly by pods-bench in both
    engines: a model's own generation_config (Qwen2.5 ships repetition_penalty 1.05, top_k 20,
    top_p 0.8) and an engine's defaults never fill in a value left out here. The defaults are the
    neutral values (plain sampling from softmax(logits / T))."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k truncation
    min_p: float = 0.0  # 0: no min-p truncation
    repetition_penalty: float = 1.0  # 1: no penalty
    max_new_tokens: int = 64
    # Per-call seed: the engine seeds its sampler with it, so a (config, seed, step) reproduces.
    seed: int | None = None

    def __post_init__(self):
        # The config's `sampling` section. Temperature 0 (greedy) is a valid distribution here:
        # evaluation samples with it; the trainer refuses it for its rollouts (pods_bench.config).
        check_distribution("sampling", self)


def check_distribution(section: str, params) -> None:
    """Checks of the truncation and length parameters of `params`: a SamplingConfig, or another config
    section with the same fields (eval). Each error is one line naming the key in `section`."""
    for ok, message in [
        (0 < params.top_p <= 1, "top_p must be in (0, 1]"),
        (params.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
        (params.top_k >= 0, "top_k must be >= 0 (0: no top-k)"),
        (0 <= params.min_p < 1, "min_p must be in [0, 1)"),
        (params.repetition_penalty > 0, "repetition_penalty must be > 0 (1: none)"),
    ]:
        if not ok:
            raise PodsBenchError(f"config key {section}.{message}")
