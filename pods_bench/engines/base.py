"""What the trainer needs from a rollout engine, and nothing more.

The trainer hands over rendered prompts and gets back n sampled completions per prompt as token
ids (plus text and, where the engine has them, sampling log-probs); after every update it pushes
the new weights with `sync_weights`. Which engine it talks to (HF generate, vLLM) is a config
choice made in `pods_bench.engines.make_engine`.

An engine's module registers a factory `(setup: EngineSetup, model, tokenizer) -> RolloutEngine` in
`ENGINES`, with the dataclass of its options (config key engine.options) if it has any; `setup` is
what an engine needs of the run's config, no more:

    @ENGINES.register("vllm", settings=VLLMEngineConfig)
    def start_vllm_engine(setup, model, tokenizer) -> VLLMEngine: ...
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from pods_bench.plugins import Registry
from pods_bench.sampling_config import SamplingConfig, check_distribution

__all__ = ["ENGINES", "EngineSetup", "RolloutEngine", "Rollouts", "SamplingConfig", "check_distribution"]

ENGINES = Registry("engine", "engine.name")


@dataclass(frozen=True)
class EngineSetup:
    """What an engine's factory gets of the run's config."""

    max_batch: int  # engine.max_batch
    # engine.options as given: the engine types them with its own options dataclass (the config's
    # check has typed them once already)
    options: dict
    model_name: str  # model.name: where an engine that loads the weights itself finds the architecture
    mixed_precision: str | None  # model.mixed_precision
    seed: int  # the run seed


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
