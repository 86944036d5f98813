"""Per-token log-probs of completion tokens without the (rows, C + 1, vocab) float32 logits tensor.

The plain way, `log_softmax(model(x).logits.float() / T)` gathered at the tokens, holds the logits
of every completion position in float32 (and the backward pass three more tensors of that size):
about 16 bytes per position x vocabulary entry, 74 GiB for 32 rows x 1024 tokens x Qwen's 151,936
entries. Here the model's own output layer (its `lm_head`) is switched, for one forward call, to
return log pi(target | prefix) instead of logits:

    log pi(y_t) = z_t[y_t] / T - logsumexp_v(z_t[v] / T),    z_t = W h_t (+ b)

computed `chunk_tokens` positions at a time, each chunk under activation checkpointing: the
forward pass keeps only the (tokens, hidden) input of the head; the backward pass recomputes one
chunk's logits at a time. Peak memory: one chunk's logits (about 16 bytes x chunk_tokens x vocab)
instead of all of them; the extra cost is one more head matmul per token in the backward pass.

Why not call `model.model` (the decoder) and the head separately: under DistributedDataParallel or
FSDP the parameters are only synchronised (or gathered) through the wrapped model's own forward, so
the switch happens inside it. Positions with mask 0 (right padding) are skipped: their log-prob is 0.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(hidden: torch.Tensor, weight, bias, targets: torch.Tensor, temperature: float):
    """(tokens,) log-probs of `targets` for one chunk of (tokens, hidden) head inputs, in float32."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def chunked_logprobs(hidden, weight, bias, targets, mask, temperature: float, chunk_tokens: int) -> torch.Tensor:
    """(B, C) log-probs of `targets` (B, C) from the head inputs `hidden` (B, C, H) of the positions
    that predict them; 0 where `mask` (B, C) is False."""
    picked, wanted = hidden[mask], targets[mask]  # (tokens, H), (tokens,): real completion tokens only
    parts = [
        checkpoint(
            _chunk_logprobs,
            picked[i : i + chunk_tokens],
            weight,
            bias,
            wanted[i : i + chunk_tokens],
            temperature,
            use_reentrant=False,  # the reentrant variant breaks DDP's gradient hooks
        )
        for i in range(0, len(picked), chunk_tokens)
    ]
    flat = torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)
    return torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device).masked_scatter(mask, flat)


@contextmanager
def head_returns_logprobs(policy, targets, mask, temperature: float, chunk_tokens: int):
    """Within the block, the output layer of `policy` (the plain module, not its DDP wrapper) maps the
    hidden states of the C + 1 kept positions (logits_to_keep) to the (B, C) log-probs of `targets`:
    position t predicts token t + 1, so the last kept position is dropped."""
    head = policy.get_output_embeddings()

    def forward(hidden):
        return chunked_logprobs(hidden[:, :-1], head.weight, head.bias, targets, mask, temperature, chunk_tokens)

    head.forward = forward  # an instance attribute: module hooks (DDP, FSDP, autocast) still run around it
    try:
        yield
    finally:
        del head.forward
