"""GRPO and GRPO-PODS training: one loop for every selection rule, rollout engine and process count.

The update (step 6) is pods_bench/update.py, resuming a run pods_bench/resume.py, the training
prompts and the sampling layer pods_bench/sampling.py; this file is the step and the run around it.

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

import math
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from pods_bench import checkpoint as ckpt
from pods_bench import model_sources, run_info
from pods_bench import run_dir as run_folder
from pods_bench.allocation import make_allocator
from pods_bench.config import TrainConfig, uses_fsdp
from pods_bench.cuda_memory import configure_allocator, peaks_gib, release_cached_memory, reset_peaks
from pods_bench.engines import make_engine
from pods_bench.errors import PodsBenchError
from pods_bench.evaluate import Share, evaluate_missing, load_benchmarks
from pods_bench.failpoints import failpoint
from pods_bench.flops import FlopsCounter
from pods_bench.io import append_jsonl
from pods_bench.resume import open_run_folder, where_to_start
from pods_bench.rewards import RewardFunction
from pods_bench.run_dir import PHASES, TRAIN_LOG, StepRecord, phase_field
from pods_bench.sampling import PromptStream, RolloutSampler, derived_seed, load_training_prompts, timed
from pods_bench.selection import choose
from pods_bench.sharding import gathered, is_sharded
from pods_bench.update import KeptRollout, Learner, all_reduce, make_learner, update_policy

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
    problems, prompts, n_dropped = load_training_prompts(cfg.task, cfg.data_dir, tokenizer)
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
        stream,
        seed=cfg.seed,
        sampling=cfg.sampling,
        grading=cfg.reward.grading,
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
