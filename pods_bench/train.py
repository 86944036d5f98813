"""GRPO and GRPO-PODS training: one loop for every selection rule, rollout engine and process count.

Per step:
  1. take P prompts (each process its share of them)
  2. the engine samples n completions per prompt
  3. rewards: math-verify correctness + format shaping (`RewardFunction`)
  4. the selection rule keeps m of the n per prompt (optionally after DAPO's filter, which drops
     prompts whose n rewards are all equal)
  5. group advantages over the kept m:  A_i = (r_i - mean_m) / (std_m + eps)
  6. a PPO-clipped policy-gradient update on the kept P x m sequences
  7. the new weights are pushed to the engine (`engine.sync_weights`)
GRPO is the rule "all" with n == m.

The training clock adds up steps 1-7 only (never evaluation or checkpoint I/O); with several
processes each step counts as long as the slowest process took. A checkpoint is written at step 0,
each time the clock passes a multiple of `budget.checkpoint_every_s`, and at the end. Rerunning the
same command resumes from the newest complete checkpoint. Output files: docs/results-format.md.

Several processes (one per GPU): every process samples, grades and selects for its P/K prompts,
gradients are averaged across processes (DDP), rank 0 writes logs and checkpoints and evaluates.

    accelerate launch --num_processes K -m pods_bench train --config X.yaml     # K GPUs
    accelerate launch --multi_gpu --num_processes K -m pods_bench train --config X.yaml --set device=cpu
                                                           # K CPU processes (gloo); accelerate's
                                                           # --cpu flag alone starts one process
"""

from __future__ import annotations

import json
import math
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import torch

from pods_bench import checkpoint as ckpt
from pods_bench.config import TrainConfig
from pods_bench.experiment import flatten
from pods_bench.errors import PodsBenchError
from pods_bench.evaluate import EVAL_LOCK, EVAL_LOG, evaluate_missing, load_benchmarks, render_prompts
from pods_bench.failpoints import failpoint
from pods_bench.io import append_jsonl, atomic_write_json, locked, remove_temporaries, truncate_jsonl

TRAIN_LOG = "train_log.jsonl"
TRAIN_LOCK = ".train.lock"  # held by the training process for the whole run
RUN_JSON = "run.json"
PHASES = ("gen", "reward", "select", "update", "sync")
# Config keys that may change when a run is resumed (e.g. a larger budget); anything else must match.
RESUMABLE_CHANGES = ("budget.", "eval.", "reward.workers")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_run_json(run_dir: str | Path) -> dict:
    path = Path(run_dir) / RUN_JSON
    if not path.is_file():
        raise PodsBenchError(f"{run_dir} is not a run folder (no {RUN_JSON})")
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PodsBenchError(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(run, dict) or not isinstance(run.get("config"), dict):
        raise PodsBenchError(f"{path} has no config mapping (not written by pods-bench train?)")
    return run


# --- training prompts ----------------------------------------------------------------------------


def load_training_prompts(cfg: TrainConfig, tokenizer):
    """(problems, prompts, number dropped as too long) of the training split."""
    from pods_bench.tasks import load_problems
    from pods_bench.tasks.prompts import filter_by_prompt_length

    problems = load_problems(cfg.task.name, cfg.task.split, data_dir=cfg.data_dir, limit=cfg.task.limit)
    if not problems:
        raise PodsBenchError(f"task {cfg.task.name!r} split {cfg.task.split!r} has no rows")
    if cfg.task.math_gold == "released" and cfg.task.name == "math":  # exact replication of a known bug
        from pods_bench.tasks.hub import released_math_gold

        problems = [replace(p, gold=released_math_gold(p.solution)) for p in problems]
    prompts = render_prompts(problems, tokenizer, cfg.task)
    kept, dropped = filter_by_prompt_length(prompts, tokenizer, cfg.task.max_prompt_tokens)
    if not kept:
        raise PodsBenchError(f"no prompt of task {cfg.task.name!r} fits task.max_prompt_tokens={cfg.task.max_prompt_tokens}")
    return [problems[i] for i in kept], [prompts[i] for i in kept], dropped


class PromptStream:
    """The training prompts in a fresh seeded order each epoch. A cursor counts the prompts handed
    out so far, so the stream's position is one integer (saved in checkpoints)."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self._orders: dict[int, np.ndarray] = {}

    def take(self, cursor: int, count: int) -> list[int]:
        out = []
        for i in range(cursor, cursor + count):
            epoch, position = divmod(i, self.size)
            if epoch not in self._orders:
                self._orders = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.size)}
            out.append(int(self._orders[epoch][position]))
        return out


def derived_seed(*parts: int) -> int:
    """A 31-bit seed from integers (run seed, step, rank, ...): distinct tuples give unrelated seeds."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0] >> 1)


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
    tensor = lambda x, dtype=torch.long: torch.tensor(x, dtype=dtype, device=device)  # noqa: E731
    return {
        "input_ids": tensor(ids),
        "attention_mask": tensor(mask),
        "completion_ids": tensor(completion),
        "completion_mask": tensor(completion_mask, torch.bool),
        "advantages": tensor([s.advantage for s in sequences], torch.float32),
    }


def completion_logprobs(model, batch: dict, temperature: float) -> torch.Tensor:
    """(B, C) log pi(token | prefix) of the completion tokens, with logits / temperature as sampled.

    Position ids are the ones generate gives left-padded rows (cumsum of the mask - 1), not the
    default 0..L-1, which would shift every left-padded row: the forward pass must see exactly what
    the sampler saw for pi / pi_old and the KL to be right (tests/test_engine_hf.py checks ~1e-6)."""
    mask = batch["attention_mask"]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    width_c = batch["completion_ids"].shape[1]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=mask,
        position_ids=position_ids,
        logits_to_keep=width_c + 1,  # only the positions that predict completion tokens
        use_cache=False,
    )
    logits = out.logits[:, :-1].float() / temperature  # position t predicts token t + 1
    # log_softmax gathered at the tokens, without materialising (B, C, vocab) log-probs twice
    return logits.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def reference_logprobs(policy, ref_model, batch: dict, temperature: float) -> torch.Tensor:
    """Log-probs under the reference policy (initial weights; with LoRA: adapters disabled)."""
    with torch.no_grad():
        if ref_model is not None:
            return completion_logprobs(ref_model, batch, temperature)
        with policy.disable_adapter():
            return completion_logprobs(policy, batch, temperature)


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


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """This micro-batch's contribution; the caller divides by the global normaliser (`normaliser`).
    "sequence": sum_i mean_t l_it (GRPO);  "token": sum_it l_it (DAPO);
    "micro_batch_token": mean_it l_it over this micro-batch's tokens (TRL's "bnpo")."""
    per_token = torch.where(mask, per_token, 0.0)
    if aggregation == "sequence":
        return (per_token.sum(1) / mask.sum(1).clamp(min=1)).sum()
    if aggregation == "micro_batch_token":
        return per_token.sum() / mask.sum().clamp(min=1)
    return per_token.sum()


def normaliser(aggregation: str, n_seqs: float, n_tokens: float, n_micro: float) -> float:
    """What the summed contributions of all processes are divided by: sequences, tokens or
    micro-batches of the whole step."""
    return {"sequence": n_seqs, "token": n_tokens, "micro_batch_token": n_micro}[aggregation]


# --- processes -----------------------------------------------------------------------------------


def all_reduce(values: list[float], accelerator, op: str = "sum") -> list[float]:
    """Sum or max of a few numbers over all processes (identity with one process)."""
    t = torch.tensor(values, dtype=torch.float64, device=accelerator.device)
    if accelerator.num_processes > 1:
        reduce_op = torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX
        torch.distributed.all_reduce(t, op=reduce_op)
    return t.tolist()


@contextmanager
def timed(times: dict, phase: str, device):
    """Adds the phase's wall time to times[phase] (waiting for queued GPU work to finish)."""
    started = time.perf_counter()
    yield
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times[phase] = times.get(phase, 0.0) + time.perf_counter() - started


# --- the update ----------------------------------------------------------------------------------


def update_policy(model, policy, ref_model, sequences: list[KeptRollout], cfg: TrainConfig, accelerator, optimizer, scheduler, pad_id: int) -> dict:
    """`optim.updates_per_batch` optimizer steps on the kept sequences of this process.

    The loss is normalised by the global number of sequences (or tokens) and multiplied by the
    number of processes, because DDP averages gradients: the result is the gradient of the mean
    over all processes' sequences, whatever their share. Every process runs the same number of
    backward passes (padding with zero-loss passes) so the gradient all-reduce stays in step."""
    world = accelerator.num_processes
    temperature = cfg.sampling.temperature if cfg.loss.divide_logits_by_temperature else 1.0
    size = cfg.optim.micro_batch_size
    micro = [pack(sequences[i : i + size], pad_id, accelerator.device) for i in range(0, len(sequences), size)]
    n_seqs, n_tokens, n_micro_total = all_reduce(
        [len(sequences), sum(len(s.completion_ids) for s in sequences), len(micro)], accelerator
    )
    n_micro = int(all_reduce([len(micro)], accelerator, op="max")[0])
    stats = {"loss": 0.0, "grad_norm": 0.0, "kl_sum": 0.0, "clipped": 0.0, "lr": scheduler.get_last_lr()[0]}
    if n_seqs == 0:  # every prompt filtered out on every process: nothing to learn from
        return stats
    divide_by = normaliser(cfg.loss.aggregation, n_seqs, n_tokens, n_micro_total) / world
    model.train()
    beta = cfg.loss.beta
    ref_logps = [reference_logprobs(policy, ref_model, b, temperature) for b in micro] if beta > 0 else None
    old_logps = None
    if cfg.optim.updates_per_batch > 1:  # pi_old stays fixed while the policy takes several steps
        with torch.no_grad():
            old_logps = [completion_logprobs(model, b, temperature) for b in micro]
    params = [p for p in model.parameters() if p.requires_grad]
    for update in range(cfg.optim.updates_per_batch):
        stats["lr"] = scheduler.get_last_lr()[0]
        for i in range(n_micro):
            last = i == n_micro - 1
            with nullcontext() if last else accelerator.no_sync(model):  # all-reduce once, at the end
                if i < len(micro):
                    b = micro[i]
                    logp = completion_logprobs(model, b, temperature)
                    # one update per batch: pi_old is the current policy, so logp.detach() is the
                    # no-grad forward pass without computing it twice (ratio 1, plain policy gradient)
                    logp_old = old_logps[i] if old_logps is not None else logp.detach()
                    per_token, kl, clipped = policy_loss_terms(
                        logp, logp_old, b["advantages"], ref_logps[i] if ref_logps else None, cfg.loss.clip_eps, beta
                    )
                    loss = aggregate(per_token, b["completion_mask"], cfg.loss.aggregation) / divide_by
                    mask = b["completion_mask"]
                    stats["loss"] += loss.item() / world / cfg.optim.updates_per_batch
                    stats["clipped"] += float(clipped[mask].sum()) / cfg.optim.updates_per_batch
                    if kl is not None and update == 0:
                        stats["kl_sum"] += float(kl.detach()[mask].sum())
                else:  # this process has no sequences left: a zero-loss pass keeps DDP in step
                    dummy = torch.full((1, 1), pad_id, device=accelerator.device)
                    loss = model(input_ids=dummy, use_cache=False).logits.sum() * 0.0
                accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(params, cfg.optim.max_grad_norm)
        stats["grad_norm"] += float(grad_norm) / cfg.optim.updates_per_batch
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return stats


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


# --- run folder ----------------------------------------------------------------------------------


def check_same_run(run: dict, cfg: TrainConfig) -> None:
    """A run folder is resumed only by the same config (budget and evaluation may change)."""
    old = flatten(run["config"])
    new = flatten(json.loads(json.dumps(cfg.to_dict(), default=str)))
    for key in sorted(set(old) | set(new)):
        if key.startswith(RESUMABLE_CHANGES):
            continue
        if old.get(key) != new.get(key):
            raise PodsBenchError(
                f"{cfg.run_dir} holds a run with another config ({key}: {old.get(key)!r} there, "
                f"{new.get(key)!r} now); choose another output_dir"
            )


def budget_reached(cfg: TrainConfig, step: int, clock: float) -> str | None:
    if cfg.budget.max_steps is not None and step >= cfg.budget.max_steps:
        return "max_steps"
    if cfg.budget.max_train_time_s is not None and clock >= cfg.budget.max_train_time_s:
        return "max_train_time_s"
    return None


# --- the loop ------------------------------------------------------------------------------------


def train(cfg: TrainConfig, progress: bool = True) -> Path:
    """Train (or resume) the run `cfg` describes; returns its folder."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, set_seed
    from tqdm import tqdm
    from transformers import get_scheduler
    from transformers.utils import logging as hf_logging

    from pods_bench import run_info
    from pods_bench.engines import make_engine
    from pods_bench.rewards import RewardFunction, gold_texts
    from pods_bench.selection import group_advantages, nonuniform_groups, select

    hf_logging.disable_progress_bar()  # no "Writing model shards" bars at every checkpoint
    accelerator = Accelerator(
        cpu=cfg.device == "cpu",
        mixed_precision=cfg.model.mixed_precision,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(hours=4))],  # rank 0 evaluates inline
    )
    if cfg.device == "cuda" and accelerator.device.type != "cuda":
        raise PodsBenchError("config key device is 'cuda' but no GPU is visible")
    rank, world, main = accelerator.process_index, accelerator.num_processes, accelerator.is_main_process
    P, n, m, G = cfg.prompts_per_step, cfg.selection.n, cfg.selection.m, cfg.selection.groups_per_prompt
    if P % world:
        raise PodsBenchError(f"config key prompts_per_step ({P}) must be a multiple of the number of processes ({world})")
    P_local = P // world
    run_dir = cfg.run_dir

    # -- where to start: a fresh run, or the newest complete checkpoint of this run (read-only so far)
    previous = read_run_json(run_dir) if (run_dir / RUN_JSON).is_file() else None
    if previous is not None:
        check_same_run(previous, cfg)
    elif ckpt.list_checkpoints(run_dir):
        raise PodsBenchError(f"{run_dir} holds checkpoints but no {RUN_JSON}; choose another output_dir")
    resume_from = ckpt.latest_checkpoint(run_dir) if previous is not None else None

    # -- model, data, engine; bad input fails here, before anything is written
    set_seed(cfg.seed)  # the same initial weights (e.g. LoRA's) on every process
    policy, tokenizer = ckpt.load_policy(cfg, resume_from)
    set_seed(derived_seed(cfg.seed, rank))  # python, numpy, torch from here on: dropout differs per process
    pad_id = tokenizer.pad_token_id
    problems, prompts, n_dropped = load_training_prompts(cfg, tokenizer)
    # loaded even when evaluation comes later (`pods-bench evaluate`): missing benchmark data should
    # stop the run now, not after hours of training
    benchmarks = load_benchmarks(cfg, tokenizer) if main else []
    ref_model = ckpt.reference_model(cfg, policy) if cfg.loss.beta > 0 else None
    model = accelerator.prepare(policy)  # DDP with several processes; `policy` stays the plain module
    policy = accelerator.unwrap_model(model)
    if ref_model is not None:
        ref_model.to(accelerator.device)
    optimizer = make_optimizer(model, cfg, world)
    scheduler = get_scheduler(
        "constant_with_warmup" if cfg.optim.schedule == "constant" else "cosine",
        optimizer,
        num_warmup_steps=cfg.optim.warmup_steps,
        num_training_steps=(cfg.budget.max_steps or 0) * cfg.optim.updates_per_batch,
    )
    selection_generator = torch.Generator().manual_seed(derived_seed(cfg.seed, rank, 1))
    stream = PromptStream(len(problems), cfg.seed)
    sampling_seed = cfg.sampling.seed if cfg.sampling.seed is not None else cfg.seed

    step, clock, cursor = 0, 0.0, 0
    if resume_from is not None:
        state = ckpt.load_training_state(resume_from, optimizer, scheduler, selection_generator, accelerator)
        step, clock, cursor = state["step"], state["train_time_s"], state["data_cursor"]
    last_checkpoint_clock, last_checkpoint_step = (clock, step) if resume_from is not None else (None, None)

    # -- the run folder: ours alone while we train (a second trainer of it stops here), logs cut
    # back to the checkpoint, so no record is lost or duplicated
    run_lock = ExitStack()
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        run_lock.enter_context(locked(run_dir / TRAIN_LOCK, busy=f"{run_dir} is being trained by another process (it holds {TRAIN_LOCK}); stop it first"))
        ckpt.remove_incomplete(run_dir)
        remove_temporaries(run_dir)
        keep = lambda r: resume_from is not None and r["step"] <= step  # noqa: E731
        truncate_jsonl(run_dir / TRAIN_LOG, keep)
        with locked(run_dir / EVAL_LOCK):
            truncate_jsonl(run_dir / EVAL_LOG, keep)
        run = {
            "experiment": cfg.experiment,
            "arm": cfg.arm,
            "seed": cfg.seed,
            "config": cfg.to_dict(),
            "versions": run_info.package_versions(),
            "hardware": {**run_info.hardware(world), "mixed_precision": accelerator.mixed_precision},
            "git": run_info.git_commit(),
            "train_prompts": len(problems),
            "train_prompts_dropped_too_long": n_dropped,
            "started_at": previous["started_at"] if resume_from is not None else now(),
            "resumed": previous["resumed"] + [{"at": now(), "checkpoint": resume_from.name}] if resume_from else [],
            "finished_at": None,
            "status": "running",
            "stop_reason": None,
            "step": step,
            "train_time_s": clock,
        }
        atomic_write_json(run_dir / RUN_JSON, run)
    accelerator.wait_for_everyone()

    engine = reward_fn = None

    def checkpoint_and_evaluate() -> None:
        """Save (every process), then evaluate inline on rank 0; none of it counts as training."""
        nonlocal last_checkpoint_clock, last_checkpoint_step
        path = ckpt.save_checkpoint(
            run_dir, step, clock, cursor, policy, tokenizer, optimizer, scheduler, selection_generator, accelerator
        )
        last_checkpoint_clock, last_checkpoint_step = clock, step
        evaluate_pending(path)

    def evaluate_pending(path: Path) -> None:
        if cfg.eval.inline and main:
            evaluate_missing(run_dir, path, engine, benchmarks, cfg, reward_fn)
        accelerator.wait_for_everyone()

    bar_total = cfg.budget.max_steps if cfg.budget.max_steps is not None else cfg.budget.max_train_time_s
    bar = tqdm(total=bar_total, initial=step if cfg.budget.max_steps is not None else min(clock, bar_total),
               disable=not (progress and main), unit="step" if cfg.budget.max_steps is not None else "s", dynamic_ncols=True,
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} {unit} [{elapsed}<{remaining}{postfix}]")
    status, stop_reason = "stopped", None
    try:
        engine = make_engine(cfg, policy, tokenizer)
        reward_fn = RewardFunction(cfg.reward)
        # start-up is not training: start the grading processes and warm the engine up (first-call
        # allocations and kernel selection; vLLM's first log-prob request alone can take seconds)
        reward_fn(["<answer>0</answer>"], ["0"])
        engine.generate(prompts[:1], 2, replace(cfg.sampling, max_new_tokens=8, seed=0))
        if resume_from is None:
            checkpoint_and_evaluate()  # step 0: the start point of every curve
        else:
            evaluate_pending(resume_from)  # a crash may have come between checkpoint and evaluation

        while (stop_reason := budget_reached(cfg, step, clock)) is None:
            times: dict[str, float] = {}
            # 1. prompts: this process's share of the next P, each as G independent groups of n
            # rollouts (G = selection.groups_per_prompt; 1 but in the paper's 8-GPU recipe)
            indices = stream.take(cursor, P)[rank * P_local : (rank + 1) * P_local]
            cursor += P
            groups = [i for i in indices for _ in range(G)]
            batch = [problems[i] for i in groups]

            # 2. rollouts
            failpoint("gen")
            with timed(times, "gen", accelerator.device):
                sampling = replace(cfg.sampling, seed=derived_seed(sampling_seed, step, rank))
                rollouts = engine.generate([prompts[i] for i in groups], n, sampling)

            # 3. rewards (P_local x G groups, n)
            with timed(times, "reward", accelerator.device):
                texts = [t for group in rollouts.completion_text for t in group]
                golds = gold_texts(batch, cfg.reward.grading)
                graded = reward_fn(texts, [g for g in golds for _ in range(n)])
                rewards = torch.tensor(graded.total, dtype=torch.float64).view(len(groups), n)

            # 4-5. selection and advantages over the kept m
            with timed(times, "select", accelerator.device):
                informative = nonuniform_groups(rewards)
                keep = informative if cfg.selection.filter_uniform_groups else torch.ones(len(groups), dtype=torch.bool)
                kept_prompts = keep.nonzero().squeeze(1).tolist()
                sequences, kept_rewards = [], torch.zeros(0, m, dtype=torch.float64)
                if kept_prompts:
                    chosen = select(cfg.selection.rule, rewards[keep], m, selection_generator)  # (kept, m)
                    kept_rewards = rewards[keep].gather(1, chosen)
                    advantages = group_advantages(kept_rewards, scale_by_std=cfg.selection.scale_advantage_by_std)
                    for row, p in enumerate(kept_prompts):
                        for j, a in zip(chosen[row].tolist(), advantages[row].tolist()):
                            sequences.append(KeptRollout(rollouts.prompt_ids[p], rollouts.completion_ids[p][j], a))

            # 6. policy-gradient update
            failpoint("update")
            with timed(times, "update", accelerator.device):
                update = update_policy(model, policy, ref_model, sequences, cfg, accelerator, optimizer, scheduler, pad_id)

            # 7. weight sync
            with timed(times, "sync", accelerator.device):
                engine.sync_weights(policy)

            # -- the clock and the log (every process agrees on the clock: max over processes)
            phase_times = all_reduce([times[p] for p in PHASES] + [sum(times.values())], accelerator, op="max")
            clock += phase_times[-1]
            step += 1
            totals = all_reduce(
                [
                    rewards.numel(), float(rewards.sum()), float((rewards.double() ** 2).sum()),
                    kept_rewards.numel(), float(kept_rewards.sum()), float((kept_rewards.double() ** 2).sum()),
                    float((~informative).sum()), len(kept_prompts), rollouts.generated_tokens,
                    sum(len(s.completion_ids) for s in sequences), float(graded.correctness.sum()),
                    float(graded.format.sum()), graded.n_timeouts + graded.n_errors,
                    update["loss"], update["kl_sum"], update["clipped"],
                ],
                accelerator,
            )
            (n_r, s_r, s2_r, n_k, s_k, s2_k, zero_var, n_kept, gen_tokens, trained_tokens,
             correct, fmt, reward_failures, loss, kl_sum, clipped) = totals
            mean_std = lambda count, s, s2: (s / count, math.sqrt(max(0.0, s2 / count - (s / count) ** 2))) if count else (None, None)  # noqa: E731
            reward_mean, reward_std = mean_std(n_r, s_r, s2_r)
            kept_mean, kept_std = mean_std(n_k, s_k, s2_k)
            record = {
                "step": step,
                "train_time_s": clock,
                **{f"time_{p}_s": t for p, t in zip(PHASES, phase_times)},
                "prompts": P,
                "groups_per_prompt": G,
                "n": n,
                "m": m,
                "generated_tokens": int(gen_tokens),
                "trained_tokens": int(trained_tokens),
                "reward_mean": reward_mean,
                "reward_std": reward_std,
                "reward_mean_kept": kept_mean,
                "reward_std_kept": kept_std,
                "zero_variance_frac": zero_var / (P * G),
                "completion_len_mean": gen_tokens / n_r,
                "loss": loss,
                "grad_norm": update["grad_norm"],
                "lr": update["lr"],
                # beyond the contract's fields
                "prompts_kept": int(n_kept),
                "correctness_mean": correct / n_r,
                "format_mean": fmt / n_r,
                "kl": kl_sum / trained_tokens if cfg.loss.beta > 0 and trained_tokens else None,
                "clip_frac": clipped / trained_tokens if trained_tokens else 0.0,
                "reward_failures": int(reward_failures),
            }
            if main:
                append_jsonl(run_dir / TRAIN_LOG, [record])
                bar.set_postfix(step=step, clock=f"{clock:.1f}s", reward=f"{reward_mean:.3f}", refresh=False)
                bar.update(1 if cfg.budget.max_steps is not None else min(clock, bar_total) - bar.n)

            # -- a checkpoint each time the clock passes a multiple of checkpoint_every_s (and, if
            # set, every checkpoint_every_steps steps)
            every, every_steps = cfg.budget.checkpoint_every_s, cfg.budget.checkpoint_every_steps
            if clock // every > last_checkpoint_clock // every or (every_steps and step % every_steps == 0):
                checkpoint_and_evaluate()

        if last_checkpoint_step != step:
            checkpoint_and_evaluate()  # the end point
        status = "finished"
    finally:
        bar.close()
        for resource in (engine, reward_fn):
            if resource is not None:
                resource.close()
        if main:
            run = read_run_json(run_dir)
            run.update(status=status, stop_reason=stop_reason, finished_at=now(), step=step, train_time_s=clock)
            atomic_write_json(run_dir / RUN_JSON, run)
        run_lock.close()
    return run_dir
