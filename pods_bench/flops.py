"""FLOPs of a training step, split into generation, update, reference passes and reward, counted
from the sequences the step really processed (docs/results-format.md, "FLOPs").

The convention (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1, with
both attention matrix products counted):

    forward over positions 1..T:   F(T) = 2 N T + 2 L d T (T + 1)
        N  multiply-accumulate weights a token passes through: every nn.Linear of the model (LoRA
           adapters and the LM head included; embedding look-ups cost nothing)
        L  decoder layers,  d  attention width (heads x head dim); position t attends to t keys:
           q.k and the weighted sum of values, 2 d t FLOPs each per layer
    generation of a rollout        F(p + c - 1)   with its KV cache every prompt and completion
                                   position but the last is processed once (p prompt, c completion
                                   tokens; the prompt is counted for every rollout, as HF generate
                                   and vLLM without prefix caching compute it)
    update of a trained sequence   3 F(p + c) for full fine-tuning (backward = 2 x forward),
                                   2 F(p + c) with LoRA (the frozen weights need no weight gradient),
                                   + F(p + c) with gradient checkpointing (the forward again);
                                   times optim.updates_per_batch, + F(p + c) for the pi_old pass
                                   when that is > 1
    reference passes               F(p + c) per trained sequence where the reference model runs
                                   (loss.beta > 0 or loss.reference_forward)
    reward                         0: the verifier (math-verify) runs on the CPU; its cost is the
                                   step's time_reward_s

Padding is not counted: these are the FLOPs the sequences need, not what padded kernels spend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pods_bench.config import TrainConfig


@dataclass(frozen=True)
class FlopsCounter:
    weights: int  # N
    layers: int  # L
    attention_width: int  # d
    update_passes: float  # forward-equivalents of one update of a sequence (3, 2, + 1 checkpointing, ...)
    reference_passes: int  # forward passes of the reference model per trained sequence (0 or 1)

    def forward(self, positions: int) -> float:
        """F(T): one forward pass over positions 1..T."""
        return 2.0 * self.weights * positions + 2.0 * self.layers * self.attention_width * positions * (positions + 1)

    def generation(self, prompt_len: int, completion_lens: list[int]) -> float:
        return sum(self.forward(prompt_len + c - 1) for c in completion_lens if prompt_len + c > 0)

    def update(self, sequence_lens: list[int]) -> float:
        return self.update_passes * sum(self.forward(t) for t in sequence_lens)

    def reference(self, sequence_lens: list[int]) -> float:
        return self.reference_passes * sum(self.forward(t) for t in sequence_lens)

    @classmethod
    def of(cls, model, cfg: TrainConfig) -> FlopsCounter:
        """The counter for `model` (a transformers causal LM, possibly with LoRA adapters) trained by `cfg`."""
        import torch

        weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        passes = 2.0 if cfg.lora.enabled else 3.0
        passes += 1.0 if cfg.model.gradient_checkpointing else 0.0
        updates = cfg.optim.updates_per_batch
        return cls(
            weights=weights,
            layers=c.num_hidden_layers,
            attention_width=c.num_attention_heads * head_dim,
            update_passes=passes * updates + (1.0 if updates > 1 else 0.0),
            reference_passes=int(cfg.loss.beta > 0 or cfg.loss.reference_forward),
        )
