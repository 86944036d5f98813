"""A budget in baseline steps: the same verdict on a fast and a slow machine.

A fixed number of seconds cuts the curves at a different point on every CPU (19 GRPO steps on one,
31 on another), so the verdict followed the machine. With the experiment key
`budget_in_baseline_steps` the workflow first times a few training steps of the baseline arm on
this machine (the `calibrate` job) and gives every arm the same seconds of training clock:

    budget_s           = steps x seconds_per_step        (the baseline's mean over `timed_steps`)
    checkpoint_every_s = budget_s / checkpoints

Time-to-target is still measured on each arm's own clock; only the horizon and the checkpoint grid
follow the machine. The first step is not timed (it pays for allocations and warm caches).
`budget.max_train_time_s` of the shared settings, if set, caps the budget (it is the scheduler's
time limit): a capped budget is recorded as such.

    pods-bench calibrate --config results/smoke/configs/train.yaml --set arm=grpo_n16_m16 ... \\
        --steps 60 --checkpoints 12 --out results/smoke/calibration

writes `calibration.json` (the measurement, the machine and the resolved budget) and `train.yaml`
(the shared settings with that budget, which the training jobs read) into --out; the timed run
stays in --out/run.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import yaml

from pods_bench.config import config_from_dict, load_config
from pods_bench.errors import require
from pods_bench.io import atomic_write_text, read_jsonl
from pods_bench.layout import CALIBRATED_CONFIG, CALIBRATION_JSON
from pods_bench.run_dir import TRAIN_LOG
from pods_bench.run_info import hardware
from pods_bench.train import train


def timed_steps(settings: dict, overrides: list[str], steps: int, run_dir: Path) -> list[float]:
    """Seconds of training clock of each of `steps` steps after an untimed first one, from a fresh
    run of `settings` + `overrides` in `run_dir` (no evaluation, no checkpoints)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh measurement: resuming would skip the steps to time
    fixed = [
        f"output_dir={run_dir}",
        f"budget.max_steps={steps + 1}",
        "budget.max_train_time_s=null",
        f"budget.checkpoint_every_s={1e12}",
        "budget.checkpoint_every_steps=null",
        "eval.inline=false",
    ]
    train(config_from_dict(settings, [*overrides, *fixed]), progress=True)
    clock = [r["train_time_s"] for r in read_jsonl(run_dir / TRAIN_LOG)]
    require(len(clock) == steps + 1, f"calibration: the timed run logged {len(clock)} of {steps + 1} steps")
    return [after - before for before, after in zip(clock, clock[1:])]


def calibrate(
    config_path: str | Path, overrides: list[str], steps: int, checkpoints: int, timed: int, out: str | Path
) -> dict:
    """Time the baseline (the --config file + `overrides`), resolve the budget, write both files."""
    require(
        steps >= 1 and checkpoints >= 1 and timed >= 1, "calibration: steps, checkpoints and timed steps must be >= 1"
    )
    out = Path(out)
    baseline = load_config(config_path, [*overrides, "budget.max_steps=1"])  # checked before anything runs
    settings = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
    cap = settings.get("budget", {}).get("max_train_time_s")
    step_times = timed_steps(settings, overrides, timed, out / "run")
    seconds_per_step = statistics.fmean(step_times)
    budget_s = steps * seconds_per_step
    capped = cap is not None and budget_s > cap
    if capped:
        budget_s = float(cap)
    calibration = {
        "arm": baseline.arm,
        "steps": steps,
        "checkpoints": checkpoints,
        "timed_steps": timed,
        "step_times_s": step_times,
        "seconds_per_step": seconds_per_step,
        "budget_s": budget_s,
        "checkpoint_every_s": budget_s / checkpoints,
        "cap_s": cap,
        "capped": capped,
        "hardware": hardware(),
    }
    budget = {
        **settings.get("budget", {}),
        "max_train_time_s": budget_s,
        "checkpoint_every_s": calibration["checkpoint_every_s"],
    }
    header = (
        f"# {CALIBRATED_CONFIG}: the shared trainer settings with the budget of {steps} steps of {baseline.arm}\n"
        f"# at {seconds_per_step:.3f} s/step on this machine ({CALIBRATION_JSON}; pods_bench/calibration.py)\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out / CALIBRATED_CONFIG, header + yaml.safe_dump({**settings, "budget": budget}, sort_keys=False)
    )
    atomic_write_text(out / CALIBRATION_JSON, json.dumps(calibration, indent=1) + "\n")
    return calibration


def cli(args) -> int:
    c = calibrate(args.config, args.set, args.steps, args.checkpoints, args.timed_steps, args.out)
    print(
        f"{c['arm']}: {c['seconds_per_step']:.3f} s/step (mean of {c['timed_steps']} steps) -> a budget of "
        f"{c['budget_s']:.1f} s ({c['steps']} steps), a checkpoint every {c['checkpoint_every_s']:.2f} s"
    )
    if c["capped"]:
        print(f"pods-bench calibrate: warning: the budget is capped at {c['cap_s']:g} s (budget.max_train_time_s)")
    print(f"wrote {Path(args.out) / CALIBRATION_JSON} and {Path(args.out) / CALIBRATED_CONFIG}")
    return 0
