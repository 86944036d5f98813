"""What the trainer needs from a rollout engine, and nothing more.

The trainer hands over rendered prompts and gets back n sampled completions per prompt as token
ids (plus text and, where the engine has them, sampling log-probs); after every update it pushes
the new weights with `sync_weights`. Which engine it talks to (HF generate, vLLM) is a config
choice made in `pods_bench.engines.make_engine`.

An engine's module registers a factory `(cfg: TrainConfig, model, tokenizer) -> RolloutEngine` in
`ENGINES`, with the dataclass of its options (config key engine.options) if it has any:

    @ENGINES.register("vllm", settings=VLLMEngineConfig)
    def start_vllm_engine(cfg, model, tokenizer) -> VLLMEngine: ...
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from pods_bench.errors import PodsBenchError
from pods_bench.plugins import Registry

ENGINES = Registry("engine", "engine.name")


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


@dataclass
class Rollouts:
    """n completions for each of P prompts. Lists are indexed [prompt][sample]."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[list[int]]]  # token ids, no padding; ends with EOS if one was produced
    # decoded without the ending EOS and padding; other special tokens stay (answer-format tags
    # such as <think> can be special tokens, and the format reward must see them)
    completion_text: list[list[str]]
    logprobs: list[list[list[float]]] | None = None  # per-token sampling log-probs, if the engine reports them
    meta: dict = field(default_factory=dict)  # engine; decode_steps where the engine counts them

    @property
    def decode_steps(self) -> int:
        """Decoding steps the engine ran: its own count (HF: the longest completion of each generate
        call, summed over calls), else the longest completion (continuous batching, all at once)."""
        return self.meta.get("decode_steps", max((len(c) for g in self.completion_ids for c in g), default=0))

    @property
    def decode_sequence_steps(self) -> int:
        """Rows x decoding steps the engine computed: its own count (HF: finished rows keep decoding
        padding until the call's longest one stops), else the generated tokens (continuous batching)."""
        return self.meta.get("decode_sequence_steps", self.generated_tokens)

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    @property
    def generated_tokens(self) -> int:
        return sum(len(c) for group in self.completion_ids for c in group)


class RolloutEngine(ABC):
    """Samples completions from the current policy."""

    name: str = "base"
    # whether generate runs the trainer's own module (then a sharded model is gathered around it)
    samples_from_trainer: bool = False

    @abstractmethod
    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> Rollouts:
        """Sample n completions for each prompt (prompts are already rendered text)."""

    @abstractmethod
    def sync_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights (called after every update)."""

    def close(self) -> None:
        """Release processes and memory. Safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
