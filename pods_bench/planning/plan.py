"""`pods-bench plan CONFIG [--hardware NAME] [--model FILE]`: memory per device, step time and the
training job's wall time of every arm of an experiment config, on its own hardware setup or another
one of config/hardware.yaml.

Step times come from a fitted step-time model (`--model`, written by `pods-bench profile`) or from
the hardware profile's first-principles coefficients; the report says which. The job's wall time
(training, inline evaluations shared by the processes, checkpoints: job_time.py) is set beside the
runtime limit the workflow asks the scheduler for, with a verdict. The workflow runs `check_fits`
on every arm before any job starts: a config that cannot fit stops with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

from pods_bench.errors import PodsBenchError
from pods_bench.experiment import hardware_setup, load_experiment, resolve_runs
from pods_bench.io import atomic_write_with
from pods_bench.planning.architecture import model_dims
from pods_bench.planning.job_time import job_time
from pods_bench.planning.memory import GIB, memory_estimate
from pods_bench.planning.step_time import StepTimeModel, from_hardware, predict
from pods_bench.run_dir import phase_field

MEMORY_PARTS = (
    "weights",
    "optimizer",
    "reference_model",
    "framework",
    "gradients",
    "activations",
    "autocast_cache",
    "optimizer_step",
    "gathered_weights",
    "gathered_units",
    "engine",
    "reserve",
    "nccl",
)
PHASES = ("update", "step", "generation")  # memory_estimate's phases, allocated bytes at each one's peak


def gib(x: float) -> float:
    return round(x / GIB, 2)


def check_processes(cfg, hardware: dict, hardware_name: str) -> None:
    """The trainer splits a step's prompts between the processes (make_accelerator refuses the rest)."""
    if cfg.prompts_per_step % hardware["processes"]:
        raise PodsBenchError(
            f"config key prompts_per_step ({cfg.prompts_per_step}) is not a multiple of the "
            f"{hardware['processes']} processes of {hardware_name}: the config cannot run there as it is"
        )


def plan_arm(
    arm: str,
    cfg,
    hardware: dict,
    hardware_name: str,
    step_model: StepTimeModel | None = None,
    resources: dict | None = None,
    job: bool = True,
) -> dict:
    """One row of the plan: memory by component (GiB per device), verdict, step time by phase (s),
    and unless `job` is False the job's wall time beside its limit (`resources`: the experiment
    config's, replacing the setup's)."""
    check_processes(cfg, hardware, hardware_name)
    dims = model_dims(cfg.model)
    memory = memory_estimate(cfg, dims, hardware)
    model = step_model or from_hardware(cfg, dims, hardware)
    seconds = predict(model, cfg, hardware["processes"])
    return {
        "arm": arm,
        "hardware": hardware_name,
        "n": cfg.selection.n,
        "m": cfg.selection.m,
        "params": dims.params,
        "trainable_params": memory["trainable_params"],
        **{f"mem_{part}_gib": gib(memory["parts"][part]) for part in MEMORY_PARTS},
        **{f"mem_{phase}_gib": gib(b) for phase, b in memory["phases"].items()},
        "mem_peak_gib": gib(memory["peak"]),
        "mem_capacity_gib": gib(memory["capacity"]),
        "fits": memory["fits"],
        "mem_floor_gib": gib(memory["floor"]),
        "fits_floor": memory["fits_floor"],
        "mem_margin_gib": gib(memory["margin"]),
        "concurrent_sequences": memory["concurrent_sequences"],
        "sequences_per_step": memory["sequences_per_step"],
        **{phase_field(phase): round(s, 4) for phase, s in seconds.items() if phase != "step"},
        "step_s": round(seconds["step"], 4),
        "step_time_source": model.source,
        **(job_time(cfg, dims, hardware, model, seconds["step"], resources) if job else {}),
    }


def verdict_line(row: dict) -> str | None:
    """Why an arm cannot fit, or may not, in one line (None: it fits at the config's limits)."""
    if row["fits"]:
        return None
    floor = not row["fits_floor"]
    # what a setting can shrink: not the allocator's reserve and NCCL's buffers, which follow the rest
    parts = [p for p in MEMORY_PARTS if p not in ("reserve", "nccl") and not (floor and p == "activations")]
    biggest = max(parts, key=lambda part: row[f"mem_{part}_gib"])
    largest = f"largest part: {biggest} {row[f'mem_{biggest}_gib']} GiB"
    if floor:
        return (
            f"arm {row['arm']} cannot fit on {row['hardware']}: weights, optimizer state, gradients and the "
            f"engine alone need {row['mem_floor_gib']} GiB per device of {row['mem_capacity_gib']} ({largest}); "
            "use LoRA, optim.fsdp (full fine-tuning on several processes), more processes or a smaller engine share"
        )
    return (
        f"arm {row['arm']} may run out of memory on {row['hardware']}: its longest batches need "
        f"{row['mem_peak_gib']} GiB per device of {row['mem_capacity_gib']} ({largest}); a smaller "
        "optim.rows_per_pass or optim.logprob_chunk_tokens, or model.gradient_checkpointing, lowers it "
        "without changing the update"
    )


def check_fits(resolved: dict, hardware: dict, hardware_name: str) -> list[str]:
    """The workflow's check before any job: an arm that cannot fit at all stops the workflow with
    one line; the warnings (arms whose longest batches may not fit) are returned to be printed."""
    warnings = []
    for arm, cfg in resolved.items():
        row = plan_arm(arm, cfg, hardware, hardware_name, job=False)
        if not row["fits_floor"]:
            raise PodsBenchError(verdict_line(row))
        if not row["fits"]:
            warnings.append(verdict_line(row))
    return warnings


def load_step_model(path: str | Path) -> StepTimeModel:
    path = Path(path)
    if not path.is_file():
        raise PodsBenchError(f"step-time model {path} does not exist (write one with `pods-bench profile`)")
    try:
        return StepTimeModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise PodsBenchError(f"step-time model {path} is not one `pods-bench profile` wrote ({e})") from None


def plan(config_path: str | Path, hardware_name: str | None = None, step_model_path: str | Path | None = None):
    """(rows, hardware name): every arm of the experiment config, planned on `hardware_name`
    (default: the config's own setup). Arms are resolved exactly as the workflow's jobs get them."""
    experiment, own = load_experiment(config_path)
    name = hardware_name or experiment.hardware
    hardware = hardware_setup(name) if hardware_name else own
    step_model = load_step_model(step_model_path) if step_model_path else None
    _, resolved = resolve_runs(experiment, own)  # the arms as the config's own setup runs them
    rows = [plan_arm(arm, cfg, hardware, name, step_model, experiment.resources) for arm, cfg in resolved.items()]
    return rows, name


def markdown(rows: list[dict]) -> str:
    """The plan as a Markdown table (memory in GiB per device, times in seconds per step)."""
    shown = MEMORY_PARTS[:2] + MEMORY_PARTS[4:]  # the reference model and framework share are in the CSV
    head = ["arm", "n/m", "peak GiB", "of", "fits", "floor GiB", "weights", "optim", "grads", "activations"]
    head += ["autocast", "optim step", "gathered", "units", "engine", "reserve", "NCCL"]
    head += ["gen s", "reward s", "update s", "sync s", "step s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        fits = "yes" if r["fits"] else ("at most" if r["fits_floor"] else "NO")
        cells = [r["arm"], f"{r['n']}/{r['m']}", r["mem_peak_gib"], r["mem_capacity_gib"], fits, r["mem_floor_gib"]]
        cells += [r[f"mem_{p}_gib"] for p in shown]
        cells += [r[phase_field(p)] for p in ("gen", "reward", "update", "sync")] + [r["step_s"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def job_markdown(rows: list[dict]) -> str:
    """The training jobs' predicted wall time beside their limit (minutes; evaluation and checkpoint in
    seconds each)."""
    head = ["arm", "steps", "train min", "evals", "eval s", "checkpoints", "checkpoint s", "job min", "limit min"]
    head += ["job fits"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        fits = {True: "yes", False: "NO", None: "no limit"}[r["job_fits"]]
        cells = [r["arm"], r["steps"], round(r["train_s"] / 60, 1), r["evaluations"], r["eval_s"], r["checkpoints"]]
        cells += [r["checkpoint_s"], r["job_min"], r["limit_min"] if r["limit_min"] is not None else "-", fits]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def job_verdict_line(row: dict) -> str | None:
    """Why an arm's training job may be stopped by its time limit, in one line (None: it fits)."""
    if row["job_fits"] is not False:
        return None
    return (
        f"arm {row['arm']} may outlast its job on {row['hardware']}: {row['job_min']} min predicted "
        f"({row['steps']} steps of {row['step_s']} s, {row['evaluations']} evaluations of {row['eval_s']} s, "
        f"{row['checkpoints']} checkpoints of {row['checkpoint_s']} s) against a limit of {row['limit_min']} min; "
        "raise the setup's runtime_overhead_min or the config's resources.train.runtime_min, or evaluate "
        "less often (budget.checkpoint_every_s) or afterwards (eval.inline: false)"
    )


def cli(args) -> int:
    import pandas as pd

    rows, name = plan(args.config, args.hardware, args.model)
    print(f"plan of {args.config} on {name} (step times: {rows[0]['step_time_source']})")
    print(markdown(rows))
    print()
    print("training job: predicted wall time (training, inline evaluations, checkpoints) and its limit")
    print(job_markdown(rows))
    if args.out:
        atomic_write_with(args.out, lambda tmp: pd.DataFrame(rows).to_csv(tmp, index=False))
        print(f"wrote {args.out}")
    for r in rows:
        if not r["fits"]:
            print(verdict_line(r))
        if r["job_fits"] is False:
            print(job_verdict_line(r))
    return 0 if all(r["fits_floor"] for r in rows) else 1
