"""GRPO and GRPO-PODS training: one loop for every selection rule, rollout engine and process count.

Per step (`train_step`):
  1. take P prompts (each process its share of them), each as G groups (G = 1 unless
     `selection.groups_per_prompt` says otherwise, as the paper's 8-GPU runs)
  2. the engine samples n completions per group
  3. rewards: math-verify correctness + format shaping (`RewardFunction`)
  (1-3 are the allocation strategy's, pods_bench/allocation/: the paper's is the one above; others
   sample in rounds, skip prompts or pilot them first, and hand over groups of n all the same)
  4. the selection rule keeps m of the n of each group (optionally after DAPO's filter, which drops
     groups whose n rewards are all equal)
  5. group advantages over the kept m:  A_i = (r_i - mean_m) / (std_m + eps)
  6. a PPO-clipped policy-gradient update on the kept P x G x m sequences
  7. the new weights are pushed to the engine (`engine.sync_weights`)
GRPO is the rule "all" with n == m.

The training clock adds up steps 1-7 only (never evaluation or checkpoint I/O); with several
processes each step counts as long as the slowest process took. A checkpoint is written at step 0,
each time the clock passes a multiple of `budget.checkpoint_every_s`, and at the end. Rerunning the
same command resumes from the newest complete checkpoint. Output files: docs/results-format.md.

Several processes (one per GPU): every process samples, grades and selects for its P/K prompts,
gradients are averaged across processes (DDP), rank 0 writes logs and checkpoints. Inline evaluation is
shared: each process samples and grades a contiguous slice of each benchmark, rank 0 merges them in
the problems' order and writes eval.jsonl (pods_bench/evaluate.py).

    accelerate launch --num_processes K -m pods_bench train --config X.yaml     # K GPUs
    accelerate launch --multi_gpu --num_processes K -m pods_bench train --config X.yaml --set device=cpu
                                                           # K CPU processes (gloo); accelerate's
                                                           # --cpu flag alone starts one process
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from pods_bench import checkpoint as ckpt
from pods_bench import model_sources, run_info
from pods_bench import run_dir as run_folder
from pods_bench.allocation import make_allocator
from pods_bench.config import TrainConfig, flatten
from pods_bench.cuda_memory import configure_allocator, peaks_gib, release_cached_memory, reset_peaks
from pods_bench.engines import make_engine
from pods_bench.errors import PodsBenchError
from pods_bench.evaluate import Share, evaluate_missing, load_benchmarks
from pods_bench.failpoints import failpoint
from pods_bench.flops import FlopsCounter
from pods_bench.io import append_jsonl, locked, remove_temporaries, truncate_jsonl
from pods_bench.logprobs import head_returns_logprobs
from pods_bench.rewards import RewardFunction
from pods_bench.run_dir import EVAL_LOCK, EVAL_LOG, PHASES, RUN_JSON, TRAIN_LOCK, TRAIN_LOG, StepRecord, phase_field
from pods_bench.sampling import PromptStream, RolloutSampler, derived_seed, timed
from pods_bench.selection import choose
from pods_bench.sharding import gathered, is_sharded, total_norm, uses_fsdp
from pods_bench.tasks import load_problems
from pods_bench.tasks.hub import released_math_gold
from pods_bench.tasks.prompts import filter_by_prompt_length, render_prompts

# Config keys that may change when a run is resumed (e.g. a larger budget); anything else must match.
RESUMABLE_CHANGES = ("budget.", "eval.", "reward.workers")


# --- training prompts ----------------------------------------------------------------------------


def load_training_prompts(cfg: TrainConfig, tokenizer):
    """(problems, prompts, number dropped as too long) of the training split."""
    problems = load_problems(cfg.task.name, cfg.task.split, data_dir=cfg.data_dir, limit=cfg.task.limit)
    if not problems:
        raise PodsBenchError(f"task {cfg.task.name!r} split {cfg.task.split!r} has no rows")
    if cfg.task.math_gold == "released" and cfg.task.name == "math":  # exact replication of a known bug
        problems = [replace(p, gold=released_math_gold(p.solution)) for p in problems]
    prompts = render_prompts(problems, tokenizer, cfg.task)
    kept, dropped = filter_by_prompt_length(prompts, tokenizer, cfg.task.max_prompt_tokens)
    if not kept:
        raise PodsBenchError(
            f"no prompt of task {cfg.task.name!r} fits task.max_prompt_tokens={cfg.task.max_prompt_tokens}"
        )
    return [problems[i] for i in kept], [prompts[i] for i in kept], dropped


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


# --- one step's pieces ---------------------------------------------------------------------------

MEMORY_KINDS = ("allocated", "reserved")  # what cuda_memory.peaks_gib returns, in its order


@dataclass
class Kept:
    """Steps 4-5 of a step: which groups and rollouts train, with their advantages."""

    sequences: list[KeptRollout]
    rewards: torch.Tensor  # (kept rollouts,) their rewards
    informative: torch.Tensor  # (groups,) whether a group's n rewards are not all equal
    groups: int  # groups kept (after the optional DAPO filter)


def keep_rollouts(batch, cfg: TrainConfig, generator: torch.Generator) -> Kept:
    """Steps 4-5: the rollouts selection.choose keeps of each group of `batch` (pods_bench.sampling.Groups,
    groups of any sizes): filter, rule or batch pruning, advantages; as the sequences the update trains on."""
    c = choose([torch.from_numpy(r) for r in batch.per_group("rewards")], cfg.selection, generator)
    sequences = [
        KeptRollout(batch.prompt_ids[c.groups[r]], batch.completion_ids[c.groups[r]][col], a)
        for r, col, a in zip(c.rows.tolist(), c.cols.tolist(), c.advantages.tolist())
    ]
    return Kept(sequences, c.rewards, c.informative, len(c.groups))


def step_sums(batch, kept: Kept, sampled: dict, update: dict) -> dict[str, float]:
    """This process's share of the step's statistics, as sums (all-reduced into `step_record`):
    `batch` the groups it selected from (pods_bench.allocation.Groups), `sampled` what it generated
    in the step (RolloutSampler.counts: more than the batch when a strategy samples in rounds)."""
    return {
        "groups": len(batch),
        "rollouts": batch.rewards.size,
        "reward_sum": float(batch.rewards.sum()),
        "reward_sq": float((batch.rewards**2).sum()),
        "kept": kept.rewards.numel(),
        "kept_sum": float(kept.rewards.sum()),
        "kept_sq": float((kept.rewards**2).sum()),
        "zero_variance": float((~kept.informative).sum()),
        "groups_kept": kept.groups,
        **sampled,  # rollouts_generated, generated_tokens, decode_steps, reward_failures
        "trained_tokens": sum(len(s.completion_ids) for s in kept.sequences),
        "correct": float(batch.correct.sum()),
        "format": float(batch.format.sum()),
        "loss": update["loss"],
        "kl_sum": update["kl_sum"],
        "clipped": update["clipped"],
        "micro_batches": update["micro_batches"],
        "update_tokens": update["update_tokens"],
    }


def _mean_std(count: float, total: float, squares: float):
    if not count:
        return None, None
    mean = total / count
    return mean, math.sqrt(max(0.0, squares / count - mean**2))


def step_record(
    cfg: TrainConfig,
    progress: Progress,
    phase_times: dict,
    sums: dict,
    update: dict,
    allocation: dict,
    memory: dict | None = None,
) -> StepRecord:
    """One train_log.jsonl line (run_dir.StepRecord) from the all-reduced sums, the allocation
    strategy's counters (the same on every process) and, on CUDA, the allocator's peaks by phase."""
    reward_mean, reward_std = _mean_std(sums["rollouts"], sums["reward_sum"], sums["reward_sq"])
    kept_mean, kept_std = _mean_std(sums["kept"], sums["kept_sum"], sums["kept_sq"])
    trained = sums["trained_tokens"]
    return StepRecord(
        step=progress.step,
        train_time_s=progress.clock,
        **{phase_field(p): phase_times[p] for p in PHASES},
        prompts=cfg.prompts_per_step,
        groups_per_prompt=cfg.selection.groups_per_prompt,
        n=cfg.selection.n,
        m=cfg.selection.m,
        generated_tokens=int(sums["generated_tokens"]),
        trained_tokens=int(trained),
        reward_mean=reward_mean,
        reward_std=reward_std,
        reward_mean_kept=kept_mean,
        reward_std_kept=kept_std,
        frac_reward_zero_std=sums["zero_variance"] / sums["groups"] if sums["groups"] else None,
        completion_len_mean=sums["generated_tokens"] / sums["rollouts_generated"],
        loss=sums["loss"],
        grad_norm=update["grad_norm"],
        lr=update["lr"],
        # beyond the contract's fields
        prompts_kept=int(sums["groups_kept"]),
        correctness_mean=sums["correct"] / sums["rollouts"] if sums["rollouts"] else None,
        format_mean=sums["format"] / sums["rollouts"] if sums["rollouts"] else None,
        kl=sums["kl_sum"] / trained if cfg.loss.beta > 0 and trained else None,
        clip_frac=sums["clipped"] / trained if trained else 0.0,
        reward_failures=int(sums["reward_failures"]),
        # what the step generated (all rounds, pilots, dropped groups): the cost axes of the analysis
        allocation=cfg.allocation.strategy,
        groups_trained=int(sums["groups"]),
        rollouts_in_groups=int(sums["rollouts"]),
        rollouts_generated=int(sums["rollouts_generated"]),
        rollouts_not_trained=int(sums["rollouts_generated"] - sums["kept"]),
        # the work behind the phase times (summed over processes): the step-time model's features
        decode_steps=int(sums["decode_steps"]),
        decode_sequence_steps=int(sums["decode_sequence_steps"]),
        micro_batches=int(sums["micro_batches"]),
        update_tokens=int(sums["update_tokens"]),
        # FLOPs by phase, summed over processes (pods_bench/flops.py); the verifier's are not counted
        flops_gen=sums["flops_gen"],
        flops_update=sums["flops_update"],
        flops_reference=sums["flops_reference"],
        flops_reward=0.0,
        # the CUDA allocator's high-water marks by phase, the largest process's (None on CPU)
        **{name: round(value, 3) for name, value in (memory or {}).items()},
        allocation_counters=allocation,  # num_gen_batches, groups_sampled and the strategy's own (docs/results-format.md)
    )


# --- the run folder and the budget ---------------------------------------------------------------


@dataclass
class Progress:
    """Where a run is: steps taken, training clock, prompts handed out, and the last checkpoint's."""

    step: int = 0
    clock: float = 0.0
    cursor: int = 0
    checkpoint_step: int | None = None
    checkpoint_clock: float | None = None

    def checkpoint_due(self, cfg: TrainConfig) -> bool:
        """Each time the clock passes a multiple of checkpoint_every_s (and every checkpoint_every_steps steps)."""
        every, every_steps = cfg.budget.checkpoint_every_s, cfg.budget.checkpoint_every_steps
        return self.clock // every > self.checkpoint_clock // every or bool(
            every_steps and self.step % every_steps == 0
        )

    def budget_reached(self, cfg: TrainConfig) -> str | None:
        if cfg.budget.max_steps is not None and self.step >= cfg.budget.max_steps:
            return "max_steps"
        if cfg.budget.max_train_time_s is not None and self.clock >= cfg.budget.max_train_time_s:
            return "max_train_time_s"
        return None


def check_same_run(run: dict, cfg: TrainConfig) -> None:
    """A run folder is resumed only by the same config (budget and evaluation may change)."""
    as_flat = lambda c: flatten(json.loads(json.dumps(c.to_dict(), default=str)))
    old, new, defaults = flatten(run["config"]), as_flat(cfg), as_flat(TrainConfig())
    for key in sorted(set(old) | set(new)):
        if key.startswith(RESUMABLE_CHANGES):
            continue
        if key not in old and new.get(key) == defaults.get(key):
            continue  # a setting added to pods-bench since the run started, at its default value
        if old.get(key) != new.get(key):
            raise PodsBenchError(
                f"{cfg.run_dir} holds a run with another config ({key}: {old.get(key)!r} there, "
                f"{new.get(key)!r} now); choose another output_dir"
            )


def where_to_start(cfg: TrainConfig) -> tuple[dict | None, Path | None]:
    """(previous run.json, checkpoint to resume from): both None for a fresh run. Reads only."""
    run_dir = cfg.run_dir
    previous = run_folder.read_run_json(run_dir) if (run_dir / RUN_JSON).is_file() else None
    if previous is not None:
        check_same_run(previous, cfg)
    elif ckpt.list_checkpoints(run_dir):
        raise PodsBenchError(f"{run_dir} holds checkpoints but no {RUN_JSON}; choose another output_dir")
    return previous, ckpt.latest_checkpoint(run_dir) if previous is not None else None


def open_run_folder(cfg: TrainConfig, resume_from: Path | None, step: int, lock: ExitStack) -> None:
    """Make the run folder ours while we train (a second trainer of it stops here, `lock` holds the
    flock) and cut its logs back to the checkpoint we resume from, so no record is lost or doubled."""
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    busy = f"{run_dir} is being trained by another process (it holds {TRAIN_LOCK}); stop it first"
    lock.enter_context(locked(run_dir / TRAIN_LOCK, busy=busy))
    # the resume point was chosen before the lock: a trainer that held it meanwhile may have
    # written a newer checkpoint (an orphan of a killed job finishing its run)
    latest = ckpt.latest_checkpoint(run_dir)
    if latest != resume_from:
        raise PodsBenchError(
            f"{run_dir} changed while this trainer started (another process wrote "
            f"{latest.name if latest else 'or removed its checkpoints'}); "
            "rerun the same command to resume from it"
        )
    ckpt.remove_incomplete(run_dir)
    remove_temporaries(run_dir)

    def keep(record: dict) -> bool:
        return resume_from is not None and record["step"] <= step

    truncate_jsonl(run_dir / TRAIN_LOG, keep)
    with locked(run_dir / EVAL_LOCK):
        truncate_jsonl(run_dir / EVAL_LOG, keep)


def progress_bar(cfg: TrainConfig, progress: Progress, show: bool):
    from tqdm import tqdm

    by_steps = cfg.budget.max_steps is not None
    total = cfg.budget.max_steps if by_steps else cfg.budget.max_train_time_s
    return tqdm(
        total=total,
        initial=progress.step if by_steps else min(progress.clock, total),
        disable=not show,
        unit="step" if by_steps else "s",
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} {unit} [{elapsed}<{remaining}{postfix}]",
    )


# --- the loop ------------------------------------------------------------------------------------


@dataclass
class Run:
    """Everything one training run holds while it trains."""

    cfg: TrainConfig
    learner: Learner
    tokenizer: Any
    problems: list
    prompts: list[str]
    benchmarks: list  # evaluation benchmarks (rank 0 at start-up; every process once it evaluates inline)
    selection_generator: torch.Generator
    allocator: Any  # the allocation strategy (pods_bench.allocation), with its per-prompt state
    progress: Progress = field(default_factory=Progress)
    engine: Any = None
    reward_fn: Any = None
    flops: FlopsCounter | None = None  # the step's FLOPs by phase (pods_bench/flops.py)

    @property
    def accelerator(self):
        return self.learner.accelerator

    def start_engines(self) -> None:
        """The rollout engine and the grading processes, warmed up: start-up is not training
        (first-call allocations and kernel selection; vLLM's first log-prob request alone can take seconds)."""
        self.engine = make_engine(self.cfg, self.learner.policy, self.tokenizer)
        self.reward_fn = RewardFunction(self.cfg.reward)
        self.reward_fn(["<answer>0</answer>"], ["0"])
        with gathered(self.learner.model, self.engine):
            self.engine.generate(self.prompts[:1], 2, replace(self.cfg.sampling, max_new_tokens=8, seed=0))

    def close(self) -> None:
        for resource in (self.engine, self.reward_fn):
            if resource is not None:
                resource.close()

    def checkpoint_and_evaluate(self) -> None:
        """Save (every process), then evaluate inline, shared by every process; none of it counts as training."""
        p = self.progress
        state = {"step": p.step, "train_time_s": p.clock, "data_cursor": p.cursor}
        path = ckpt.save_checkpoint(
            self.cfg.run_dir, state, self.learner, self.tokenizer, self.selection_generator, self.allocator
        )
        p.checkpoint_step, p.checkpoint_clock = p.step, p.clock
        self.evaluate_pending(path)

    def evaluate_pending(self, checkpoint: Path) -> None:
        """Evaluate `checkpoint` on the benchmarks it has no record for: every process samples and
        grades its slice of each benchmark on whole weights (HF generate on the gathered model, or its
        own vLLM engine), rank 0 merges the slices and writes the records (pods_bench/evaluate.py)."""
        accelerator = self.accelerator
        share = Share(accelerator.process_index, accelerator.num_processes)
        if self.cfg.eval.inline and not self.benchmarks:  # loaded at start-up by rank 0 alone
            self.benchmarks = load_benchmarks(self.cfg, self.tokenizer)
        with gathered(self.learner.model, self.engine):  # all gather: whole weights while generating
            if self.cfg.eval.inline:
                evaluate_missing(
                    self.cfg.run_dir, checkpoint, self.engine, self.benchmarks, self.cfg, self.reward_fn, share
                )
            accelerator.wait_for_everyone()


def prepare_run(cfg: TrainConfig, accelerator, resume_from: Path | None) -> tuple[Run, int]:
    """(run, prompts dropped as too long): model, optimizer and data, at the checkpoint's progress
    when resuming. Bad input fails here, before anything is written."""
    learner, tokenizer = make_learner(cfg, accelerator, resume_from)
    problems, prompts, n_dropped = load_training_prompts(cfg, tokenizer)
    # loaded even when evaluation comes later (`pods-bench evaluate`): missing benchmark data should
    # stop the run now, not after hours of training
    benchmarks = load_benchmarks(cfg, tokenizer) if accelerator.is_main_process else []
    generator = torch.Generator().manual_seed(derived_seed(cfg.seed, accelerator.process_index, 1))
    allocator = make_allocator(cfg, len(problems))
    run = Run(cfg, learner, tokenizer, problems, prompts, benchmarks, generator, allocator)
    run.flops = FlopsCounter.of(learner.policy, cfg)
    if resume_from is not None:
        state = ckpt.load_training_state(resume_from, learner, generator, allocator)
        step, clock = state["step"], state["train_time_s"]
        run.progress = Progress(step, clock, state["data_cursor"], checkpoint_step=step, checkpoint_clock=clock)
    return run, n_dropped


def make_accelerator(cfg: TrainConfig):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    # whether FSDP shards this run (the launcher's WORLD_SIZE: the process group does not exist yet),
    # and so casts the parameters to bf16 itself (sharding.py), which leaves no autocast to do on top
    sharded = uses_fsdp(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    accelerator = Accelerator(
        cpu=cfg.device == "cpu",
        mixed_precision="no" if sharded else cfg.model.mixed_precision,
        kwargs_handlers=[
            InitProcessGroupKwargs(timeout=timedelta(hours=4)),  # checkpoint writes and evaluation between collectives
            # gradients live in DDP's all-reduce buckets instead of beside them: one copy, not two
            DistributedDataParallelKwargs(gradient_as_bucket_view=True),
        ],
    )
    if cfg.device == "cuda" and accelerator.device.type != "cuda":
        raise PodsBenchError("config key device is 'cuda' but no GPU is visible")
    if cfg.prompts_per_step % accelerator.num_processes:
        raise PodsBenchError(
            f"config key prompts_per_step ({cfg.prompts_per_step}) must be a multiple of the "
            f"number of processes ({accelerator.num_processes})"
        )
    return accelerator


def train_step(run: Run, stream: PromptStream) -> StepRecord:
    """One step of GRPO / GRPO-PODS, steps 1-7 of the module docstring; returns its log record."""
    cfg, p, accelerator = run.cfg, run.progress, run.accelerator

    # 1-3. prompts, rollouts and rewards: the allocation strategy decides which prompts get how many
    # rollouts (the paper's: the next P prompts, n each, as G groups with selection.groups_per_prompt);
    # the sampler times generation and grading, the strategy's own bookkeeping counts as selection
    failpoint("gen")
    sampler = RolloutSampler(
        cfg,
        stream,
        step=p.step,
        cursor=p.cursor,
        prompts=run.prompts,
        problems=run.problems,
        engine=run.engine,
        grade=run.reward_fn,
        rank=accelerator.process_index,
        world=accelerator.num_processes,
        device=accelerator.device,
        flops=run.flops,
    )
    started = time.perf_counter()
    device = accelerator.device
    reset_peaks(device)
    with gathered(run.learner.model, run.engine):  # sharded weights: whole while HF generate samples
        batch, allocation = run.allocator.collect(sampler)
    peaks = {"gen": peaks_gib(device)}  # CUDA allocator high-water marks by phase (None on CPU)
    release_cached_memory(device)  # the KV cache's blocks, of other shapes than the update's
    p.cursor, times = sampler.cursor, sampler.times  # every prompt drawn is consumed
    times["select"] = max(0.0, time.perf_counter() - started - times.get("gen", 0.0) - times.get("reward", 0.0))

    # 4-5. selection of m per group, advantages over the kept m
    with timed(times, "select", accelerator.device):
        kept = keep_rollouts(batch, cfg, run.selection_generator)

    # 6. policy-gradient update
    failpoint("update")
    reset_peaks(device)
    with timed(times, "update", accelerator.device):
        update = update_policy(run.learner, kept.sequences, cfg)
    peaks["update"] = peaks_gib(device)

    # 7. weight sync
    reset_peaks(device)
    with timed(times, "sync", accelerator.device):
        run.engine.sync_weights(run.learner.policy)
    peaks["sync"] = peaks_gib(device)

    # the clock (every process agrees: the slowest one's phases) and the record
    phase_times = all_reduce(
        {**{ph: times.get(ph, 0.0) for ph in PHASES}, "step": sum(times.values())}, accelerator, op="max"
    )
    p.clock += phase_times["step"]
    p.step += 1
    trained = [len(s.prompt_ids) + len(s.completion_ids) for s in kept.sequences]
    flops = {"flops_update": run.flops.update(trained), "flops_reference": run.flops.reference(trained)}
    sums = all_reduce({**step_sums(batch, kept, sampler.counts, update), **flops}, accelerator)
    memory = {}
    if device.type == "cuda":  # the largest process's
        named = {f"peak_{kind}_{phase}_gib": v[i] for phase, v in peaks.items() for i, kind in enumerate(MEMORY_KINDS)}
        memory = all_reduce(named, accelerator, op="max")
    return step_record(cfg, p, phase_times, sums, update, allocation, memory)


def train(cfg: TrainConfig, progress: bool = True) -> Path:
    """Train (or resume) the run `cfg` describes; returns its folder."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bars at every checkpoint
    allocator_config = configure_allocator()  # before the accelerator touches CUDA
    accelerator = make_accelerator(cfg)
    main = accelerator.is_main_process
    previous, resume_from = where_to_start(cfg)
    run, n_dropped = prepare_run(cfg, accelerator, resume_from)
    p, stream = run.progress, PromptStream(len(run.problems), cfg.seed)

    lock = ExitStack()
    if main:
        open_run_folder(cfg, resume_from, p.step, lock)
        hardware = {**run_info.hardware(accelerator.num_processes), "mixed_precision": accelerator.mixed_precision}
        if accelerator.device.type == "cuda":
            hardware["cuda_allocator"] = allocator_config
        if is_sharded(run.learner.model):  # FSDP casts the parameters, not accelerate's autocast
            hardware |= {"mixed_precision": cfg.model.mixed_precision or "no", "sharding": "fsdp2"}
        run_folder.start_run(
            cfg,
            previous,
            resume_from,
            p.step,
            p.clock,
            {
                "hardware": hardware,
                "train_prompts": len(run.problems),
                "train_prompts_dropped_too_long": n_dropped,
                "model_source": model_sources.resolve(cfg.model.name).record,  # a GGUF file's hash; else None
            },
        )
    accelerator.wait_for_everyone()

    bar = progress_bar(cfg, p, progress and main)
    status, stop_reason = "stopped", None
    try:
        run.start_engines()
        if resume_from is None:
            run.checkpoint_and_evaluate()  # step 0: the start point of every curve
        else:
            run.evaluate_pending(resume_from)  # a crash may have come between checkpoint and evaluation
        while (stop_reason := p.budget_reached(cfg)) is None:
            record = train_step(run, stream)
            if main:
                append_jsonl(cfg.run_dir / TRAIN_LOG, [record.as_line()])
                reward = record.reward_mean  # None for a step that trained on no group (when_short: train)
                shown = "n/a" if reward is None else f"{reward:.3f}"
                bar.set_postfix(step=p.step, clock=f"{p.clock:.1f}s", reward=shown, refresh=False)
                bar.update(1 if cfg.budget.max_steps is not None else min(p.clock, bar.total) - bar.n)
            if p.checkpoint_due(cfg):
                run.checkpoint_and_evaluate()
        if p.checkpoint_step != p.step:
            run.checkpoint_and_evaluate()  # the end point
        status = "finished"
    finally:
        bar.close()
        run.close()
        if main:
            run_folder.finish_run(cfg.run_dir, status, stop_reason, p.step, p.clock)
        lock.close()
    return cfg.run_dir
