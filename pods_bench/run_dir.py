"""The run folder: the name of every file and lock a training run writes, their readers, and the
start and end of a run's record. docs/results-format.md describes the same files for readers.

    <run>/run.json            resolved config, versions, hardware, status (`start_run`, `finish_run`)
    <run>/train_log.jsonl     one line per step (`TRAIN_LOG`; a `StepRecord`, docs/results-format.md)
    <run>/eval.jsonl          one line per checkpoint x benchmark (`EVAL_LOG`)
    <run>/checkpoints/step-N  complete checkpoints (pods_bench/checkpoint.py)
    <run>/.train.lock         held by the one process training the run
    <run>/.eval.lock          held while eval.jsonl is checked and appended
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path

from pods_bench import run_info
from pods_bench.errors import PodsBenchError
from pods_bench.io import atomic_write_json
from pods_bench.slurm import current_job

RUN_JSON = "run.json"
TRAIN_LOG = "train_log.jsonl"
EVAL_LOG = "eval.jsonl"
CHECKPOINTS = "checkpoints"
TRAIN_LOCK = ".train.lock"
EVAL_LOCK = ".eval.lock"

# The phases of a training step, in order: the trainer times each (train_log field `time_<phase>_s`)
# and the training clock is their sum; the analysis labels them (and adds "other", the rest of a step).
PHASES = ("gen", "reward", "select", "update", "sync")
PHASE_LABELS = {"gen": "generation", "reward": "rewards", "select": "selection", "update": "update", "sync": "sync"}


def phase_field(phase: str) -> str:
    return f"time_{phase}_s"


@dataclass
class StepRecord:
    """One line of train_log.jsonl: every field the trainer writes (units and meanings in
    docs/results-format.md, which tests/test_results_format.py holds to this list). The allocation
    strategy's own counters (`num_gen_batches`, `groups_sampled`, and e.g. Pilot-Commit's `buffer_size`) come
    after these in the line."""

    step: int
    train_time_s: float  # the training clock after the step: the sum of the phase times so far
    time_gen_s: float  # phase_field(phase) for each of PHASES
    time_reward_s: float
    time_select_s: float
    time_update_s: float
    time_sync_s: float
    prompts: int
    groups_per_prompt: int
    n: int
    m: int
    generated_tokens: int
    trained_tokens: int
    reward_mean: float | None  # None: no group was handed to selection (a short batch)
    reward_std: float | None
    reward_mean_kept: float | None
    reward_std_kept: float | None
    frac_reward_zero_std: float | None
    completion_len_mean: float
    loss: float
    grad_norm: float
    lr: float
    prompts_kept: int
    correctness_mean: float | None
    format_mean: float | None
    kl: float | None
    clip_frac: float
    reward_failures: int
    allocation: str
    groups_trained: int
    rollouts_in_groups: int
    rollouts_generated: int
    rollouts_not_trained: int  # generated in the step minus trained in it (TRL/verl's wasted rollouts)
    decode_steps: int  # these four: the work behind the phase times, the step-time model's features
    decode_sequence_steps: int
    micro_batches: int
    update_tokens: int
    flops_gen: float  # these four: FLOPs of the step by phase (pods_bench/flops.py)
    flops_update: float
    flops_reference: float
    flops_reward: float
    # the CUDA allocator's high-water marks in GiB, by phase (gen: sampling and grading on the whole
    # weights; update; sync), the largest process's; None on CPU
    peak_allocated_gen_gib: float | None = None
    peak_reserved_gen_gib: float | None = None
    peak_allocated_update_gib: float | None = None
    peak_reserved_update_gib: float | None = None
    peak_allocated_sync_gib: float | None = None
    peak_reserved_sync_gib: float | None = None
    allocation_counters: dict = field(default_factory=dict)

    def as_line(self) -> dict:
        """The line as written: the fields above, then the strategy's counters."""
        line = asdict(self)
        counters = line.pop("allocation_counters")
        return {**line, **counters}

    @staticmethod
    def field_names() -> list[str]:
        return [f.name for f in fields(StepRecord) if f.name != "allocation_counters"]


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def load_run_json(path: str | Path) -> dict | None:
    """The content of a run.json file; None if there is none, a one-line error if it is not JSON."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PodsBenchError(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None


def read_run_json(run_dir: str | Path) -> dict:
    """run.json of a run folder written by the trainer (with its config), or a one-line error."""
    path = Path(run_dir) / RUN_JSON
    run = load_run_json(path)
    if run is None:
        raise PodsBenchError(f"{run_dir} is not a run folder (no {RUN_JSON})")
    if not isinstance(run, dict) or not isinstance(run.get("config"), dict):
        raise PodsBenchError(f"{path} has no config mapping (not written by pods-bench train?)")
    return run


def start_run(cfg, previous: dict | None, resume_from: Path | None, step: int, clock: float, extra: dict) -> None:
    """Write run.json for a run that starts (or resumes at `resume_from`): the resolved config, seed,
    package versions and hardware, status "running". `extra` adds fields (hardware, data counts)."""
    job = current_job()
    jobs = [{**job, "at": now()}] if job else []
    run = {
        "experiment": cfg.experiment,
        "arm": cfg.arm,
        "seed": cfg.seed,
        "config": cfg.to_dict(),
        "versions": run_info.package_versions(),
        "git": run_info.git_commit(),
        **extra,
        "started_at": previous["started_at"] if resume_from is not None else now(),
        "resumed": previous["resumed"] + [{"at": now(), "checkpoint": resume_from.name}] if resume_from else [],
        # every SLURM job the run has trained in, the resumed ones after the first
        "scheduler_jobs": (previous.get("scheduler_jobs", []) if resume_from else []) + jobs,
        "finished_at": None,
        "status": "running",
        "stop_reason": None,
        "step": step,
        "train_time_s": clock,
    }
    atomic_write_json(Path(cfg.run_dir) / RUN_JSON, run)


def finish_run(run_dir: str | Path, status: str, stop_reason: str | None, step: int, clock: float) -> None:
    """Record how the run ended ("finished" or "stopped") in run.json."""
    run = read_run_json(run_dir)
    run.update(status=status, stop_reason=stop_reason, finished_at=now(), step=step, train_time_s=clock)
    atomic_write_json(Path(run_dir) / RUN_JSON, run)
