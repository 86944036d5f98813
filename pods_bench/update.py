"""The policy update of a training step (step 6 of pods_bench/train.py): the kept rollouts packed into
rows, their log-probs under the policy (and the reference), the PPO-clipped loss and its aggregation,
and the optimizer steps, with several processes kept in step.

    pack             kept rollouts -> [left-padded prompt | completion] rows, as generate lays them out
    completion_logprobs   log pi(token | prefix) of the completion tokens, logits / temperature
    policy_loss_terms     L = -min(ratio A, clip(ratio, 1 - eps, 1 + eps) A) (+ beta KL)
    aggregate / normaliser   "sequence" (GRPO), "token" (DAPO) or "micro_batch_token" (TRL's bnpo)
    update_policy    `optim.updates_per_batch` optimizer steps on this process's kept rollouts
    make_learner     the policy, its reference, optimizer and lr schedule (DDP or FSDP)
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pods_bench import checkpoint as ckpt
from pods_bench.config import TrainConfig, uses_fsdp
from pods_bench.logprobs import head_returns_logprobs
from pods_bench.sampling import derived_seed
from pods_bench.sharding import is_sharded, total_norm

# --- sequences and log-probs ---------------------------------------------------------------------


@dataclass
class KeptRollout:
    """One kept rollout: the prompt's and completion's token ids and its advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float


def pack(sequences: list[KeptRollout], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Rows laid out as generate lays them out: [left-padded prompt | completion, right-padded].

    input_ids, attention_mask: (B, Lp + C); completion_ids, completion_mask: (B, C); advantages (B,)."""
    width_p = max(len(s.prompt_ids) for s in sequences)
    width_c = max(1, max(len(s.completion_ids) for s in sequences))
    ids, mask, completion, completion_mask = [], [], [], []
    for s in sequences:
        left, right = width_p - len(s.prompt_ids), width_c - len(s.completion_ids)
        ids.append([pad_id] * left + s.prompt_ids + s.completion_ids + [pad_id] * right)
        mask.append([0] * left + [1] * (len(s.prompt_ids) + len(s.completion_ids)) + [0] * right)
        completion.append(s.completion_ids + [pad_id] * right)
        completion_mask.append([1] * len(s.completion_ids) + [0] * right)
    tensor = lambda x, dtype=torch.long: torch.tensor(x, dtype=dtype, device=device)
    return {
        "input_ids": tensor(ids),
        "attention_mask": tensor(mask),
        "completion_ids": tensor(completion),
        "completion_mask": tensor(completion_mask, torch.bool),
        "advantages": tensor([s.advantage for s in sequences], torch.float32),
    }


def completion_logprobs(model, batch: dict, temperature: float, chunk_tokens: int = 1024) -> torch.Tensor:
    """(B, C) log pi(token | prefix) of the completion tokens, with logits / temperature as sampled;
    0 at padding. The output layer hands back log-probs `chunk_tokens` positions at a time
    (pods_bench/logprobs.py), never the float32 logits of the whole batch.

    Position ids are the ones generate gives left-padded rows (cumsum of the mask - 1), not the
    default 0..L-1, which would shift every left-padded row: the forward pass must see exactly what
    the sampler saw for pi / pi_old and the KL to be right (tests/test_engine_hf.py checks ~1e-6)."""
    mask = batch["attention_mask"]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    targets, target_mask = batch["completion_ids"], batch["completion_mask"]
    policy = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    with head_returns_logprobs(policy, targets, target_mask, temperature, chunk_tokens):
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=mask,
            position_ids=position_ids,
            logits_to_keep=targets.shape[1] + 1,  # only the positions that predict completion tokens
            use_cache=False,
        )
    return out.logits  # (B, C) log-probs, in the place of logits


def reference_logprobs(policy, ref_model, batch: dict, temperature: float, chunk_tokens: int) -> torch.Tensor:
    """Log-probs under the reference policy (initial weights; with LoRA: adapters disabled).

    The frozen copy of full fine-tuning computes as the policy does: accelerate wraps the forward
    of the model it prepared (the policy, marked by `_original_forward`) in the run's autocast, and
    the copy gets the same here. Outside it, fp32 master weights would run the copy in float32: twice
    the time and memory, and a KL that starts from the precision gap instead of 0."""
    from accelerate.utils import get_mixed_precision_context_manager

    with torch.no_grad():
        if ref_model is not None:
            with get_mixed_precision_context_manager(native_amp=hasattr(policy, "_original_forward")):
                return completion_logprobs(ref_model, batch, temperature, chunk_tokens)
        with policy.disable_adapter():
            return completion_logprobs(policy, batch, temperature, chunk_tokens)


def unused_reference_forward(learner, passes: list[dict], temperature: float, chunk_tokens: int) -> None:
    """`loss.reference_forward` at beta 0: the reference log-probs of the kept rollouts, computed pass by
    pass (`loss_passes`) and dropped, as the paper's single-GPU trainer computes them every step whether
    or not the KL term uses them (3fc107e trainer/maxvargrpo_trainer.py:L543-552). Only its time counts."""
    for batch in passes:
        reference_logprobs(learner.policy, learner.ref_model, batch, temperature, chunk_tokens)


# --- the loss ------------------------------------------------------------------------------------


def policy_loss_terms(logp, logp_old, advantages, ref_logp, clip_eps: float, beta: float):
    """Per-token loss (B, C) of the PPO-clipped objective with an optional KL penalty, plus the
    per-token KL and whether the ratio was clipped (for logging)."""
    ratio = torch.exp(logp - logp_old)  # pi / pi_old; exactly 1 on the first update of a batch
    a = advantages.unsqueeze(1)
    # L = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)
    unclipped, clipped_term = ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a
    loss = -torch.min(unclipped, clipped_term)
    clipped = clipped_term < unclipped  # where clipping changed the objective (no gradient there)
    kl = None
    if ref_logp is not None:
        # k3 estimator of KL(pi || pi_ref) (Schulman; DeepSeekMath, TRL): exp(d) - d - 1, d = ref - logp
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        loss = loss + beta * kl
    return loss, kl, clipped


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str, micro_batch_tokens: int) -> torch.Tensor:
    """This pass's contribution; the caller divides by the global normaliser (`normaliser`).
    "sequence": sum_i mean_t l_it (GRPO);  "token": sum_it l_it (DAPO);
    "micro_batch_token": sum_it l_it / (tokens of the whole micro-batch), i.e. the micro-batch's token
    mean (TRL's "bnpo") when its rows are split over several passes. All three are sums over rows,
    so splitting a micro-batch into passes leaves the gradient as it is."""
    per_token = torch.where(mask, per_token, 0.0)
    if aggregation == "sequence":
        return (per_token.sum(1) / mask.sum(1).clamp(min=1)).sum()
    if aggregation == "micro_batch_token":
        return per_token.sum() / max(1, micro_batch_tokens)
    return per_token.sum()


def normaliser(aggregation: str, n_seqs: float, n_tokens: float, n_micro: float) -> float:
    """What the summed contributions of all processes are divided by: sequences, tokens or
    micro-batches of the whole step."""
    return {"sequence": n_seqs, "token": n_tokens, "micro_batch_token": n_micro}[aggregation]


# --- processes -----------------------------------------------------------------------------------


def all_reduce(values: dict[str, float], accelerator, op: str = "sum") -> dict[str, float]:
    """Sum or max of a few named numbers over all processes (identity with one process). Every
    process passes the same names in the same order."""
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=accelerator.device)
    if accelerator.num_processes > 1:
        reduce_op = torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX
        torch.distributed.all_reduce(t, op=reduce_op)
    return dict(zip(values, t.tolist()))


# --- the update ----------------------------------------------------------------------------------


@dataclass
class Learner:
    """What a policy update works on."""

    model: Any  # forward/backward run on this (DDP-wrapped with several processes)
    policy: Any  # the plain module: adapters, saving, the engine's weights
    ref_model: Any  # frozen reference of the KL term; None without KL or with LoRA (adapters disabled)
    optimizer: Any
    scheduler: Any
    accelerator: Any
    pad_id: int


def loss_passes(sequences: list[KeptRollout], cfg: TrainConfig, pad_id: int, device) -> list[dict]:
    """The forward/backward passes of an update: micro-batches of `optim.micro_batch_size` sequences
    (they define "micro_batch_token" aggregation), each cut into passes of at most
    `optim.rows_per_pass` rows, which bounds memory only. Each pass is a packed batch (`pack`) that
    also carries its micro-batch's completion-token count."""
    size = cfg.optim.micro_batch_size
    rows = cfg.optim.rows_per_pass or size
    passes = []
    for start in range(0, len(sequences), size):
        micro = sequences[start : start + size]
        tokens = sum(len(s.completion_ids) for s in micro)
        for i in range(0, len(micro), rows):
            passes.append({**pack(micro[i : i + rows], pad_id, device), "micro_batch_tokens": tokens})
    return passes


def update_policy(learner: Learner, sequences: list[KeptRollout], cfg: TrainConfig) -> dict:
    """`optim.updates_per_batch` optimizer steps on the kept sequences of this process.

    The loss is normalised by the global number of sequences (or tokens, or micro-batches) and
    multiplied by the number of processes, because DDP averages gradients: the result is the gradient
    of the mean over all processes' sequences, whatever their share. Every process runs the same
    number of forward/backward passes (padding with zero-loss passes) so the gradient all-reduce (and
    a sharded model's parameter gathering) stays in step."""
    model, accelerator, optimizer, scheduler = learner.model, learner.accelerator, learner.optimizer, learner.scheduler
    world = accelerator.num_processes
    temperature = cfg.sampling.temperature if cfg.loss.divide_logits_by_temperature else 1.0
    chunk = cfg.optim.logprob_chunk_tokens
    micro = loss_passes(sequences, cfg, learner.pad_id, accelerator.device)
    n_micro_batches = math.ceil(len(sequences) / cfg.optim.micro_batch_size)
    counts = all_reduce(
        {"seqs": len(sequences), "tokens": sum(len(s.completion_ids) for s in sequences), "micro": n_micro_batches},
        accelerator,
    )
    n_micro = int(all_reduce({"passes": len(micro)}, accelerator, op="max")["passes"])
    stats = {"loss": 0.0, "grad_norm": 0.0, "kl_sum": 0.0, "clipped": 0.0, "lr": scheduler.get_last_lr()[0]}
    # the work of the passes (what the step-time model of pods_bench/planning/ fits): padded rows x width
    stats["micro_batches"], stats["update_tokens"] = len(micro), sum(b["input_ids"].numel() for b in micro)
    if counts["seqs"] == 0:  # every prompt filtered out on every process: nothing to learn from
        return stats
    divide_by = normaliser(cfg.loss.aggregation, counts["seqs"], counts["tokens"], counts["micro"]) / world
    if cfg.loss.reference_forward and cfg.loss.beta == 0:  # the authors' clock paid for it (docs/fidelity.md)
        unused_reference_forward(learner, micro, temperature, chunk)
    model.train()
    beta, updates = cfg.loss.beta, cfg.optim.updates_per_batch
    ref_logps = (
        [reference_logprobs(learner.policy, learner.ref_model, b, temperature, chunk) for b in micro]
        if beta > 0
        else None
    )
    old_logps = None
    if updates > 1:  # pi_old stays fixed while the policy takes several steps
        with torch.no_grad():
            old_logps = [completion_logprobs(model, b, temperature, chunk) for b in micro]
    params = [p for p in model.parameters() if p.requires_grad]
    for update in range(updates):
        stats["lr"] = scheduler.get_last_lr()[0]
        for i in range(n_micro):
            last = i == n_micro - 1
            with gradient_sync_at_last(model, accelerator, last):  # DDP: all-reduce once, at the end
                if i < len(micro):
                    b = micro[i]
                    logp = completion_logprobs(model, b, temperature, chunk)
                    # one update per batch: pi_old is the current policy, so logp.detach() is the
                    # no-grad forward pass without computing it twice (ratio 1, plain policy gradient)
                    logp_old = old_logps[i] if old_logps is not None else logp.detach()
                    per_token, kl, clipped = policy_loss_terms(
                        logp, logp_old, b["advantages"], ref_logps[i] if ref_logps else None, cfg.loss.clip_eps, beta
                    )
                    mask = b["completion_mask"]
                    loss = aggregate(per_token, mask, cfg.loss.aggregation, b["micro_batch_tokens"]) / divide_by
                    stats["loss"] += loss.item() / world / updates
                    stats["clipped"] += float(clipped[mask].sum()) / updates
                    if kl is not None and update == 0:
                        stats["kl_sum"] += float(kl.detach()[mask].sum())
                else:  # this process has no sequences left: a zero-loss pass keeps DDP in step
                    dummy = torch.full((1, 1), learner.pad_id, device=accelerator.device)
                    loss = model(input_ids=dummy, use_cache=False).logits.sum() * 0.0
                accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(params, cfg.optim.max_grad_norm)
        stats["grad_norm"] += total_norm(grad_norm) / updates
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return stats


@contextmanager
def gradient_sync_at_last(model, accelerator, last: bool):
    """DDP all-reduces gradients in the last backward pass of an update only (the others accumulate
    into its buckets, which hold the whole gradient anyway). FSDP reduce-scatters in every pass, as
    ZeRO-2 does: accumulating whole gradients between passes would hold 4 bytes per parameter on
    every process instead of 4 / K (pods_bench/sharding.py)."""
    with nullcontext() if last or is_sharded(model) else accelerator.no_sync(model):
        yield


def make_optimizer(model, cfg: TrainConfig, world: int):
    """AdamW over the trainable parameters; with several processes and `optim.shard_optimizer_state`,
    PyTorch's ZeroRedundancyOptimizer (ZeRO stage 1): each process keeps the moments of 1/K of the
    parameters and broadcasts its updated share, so the update equals plain AdamW's. Chosen over
    DeepSpeed ZeRO-2 and FSDP because it leaves the parameters whole between steps (HF generate and
    checkpoints see the ordinary model), works with gloo on CPU (tested) and needs no dependency; the
    gradients stay replicated (ZeRO-2 would shard them too: memory only, same update)."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay)
    if cfg.optim.shard_optimizer_state and world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **kwargs)
    return torch.optim.AdamW(params, **kwargs)


def make_learner(cfg: TrainConfig, accelerator, resume_from: Path | None):
    """(learner, tokenizer): the policy (from the checkpoint when resuming), its reference, optimizer
    and lr schedule, placed by accelerate (DDP with several processes) or sharded (FSDP: rank 0
    alone loads the weights, checkpoint.load_sharded_policy)."""
    from accelerate.utils import set_seed
    from transformers import get_scheduler

    sharded = uses_fsdp(cfg, accelerator.num_processes)
    set_seed(cfg.seed)  # the same initial weights (e.g. LoRA's) on every process
    if sharded:  # sharded as it is built: the model is the policy
        policy, tokenizer = ckpt.load_sharded_policy(cfg, accelerator, resume_from)
    else:
        policy, tokenizer = ckpt.load_policy(cfg, resume_from)
    set_seed(derived_seed(cfg.seed, accelerator.process_index))  # from here on dropout differs per process
    ref_model = ckpt.reference_model(cfg, policy) if cfg.loss.beta > 0 or cfg.loss.reference_forward else None
    if sharded:
        model = policy
    else:
        model = accelerator.prepare(policy)
        policy = accelerator.unwrap_model(model)
    if ref_model is not None:
        ref_model.to(accelerator.device)
    optimizer = make_optimizer(model, cfg, accelerator.num_processes)
    scheduler = get_scheduler(
        "constant_with_warmup" if cfg.optim.schedule == "constant" else "cosine",
        optimizer,
        num_warmup_steps=cfg.optim.warmup_steps,
        num_training_steps=(cfg.budget.max_steps or 0) * cfg.optim.updates_per_batch,
    )
    return Learner(model, policy, ref_model, optimizer, scheduler, accelerator, tokenizer.pad_token_id), tokenizer
