"""A budget in baseline steps: the same verdict on a fast and a slow machine.

A fixed number of seconds cuts the curves at a different point on every CPU (19 GRPO steps on one,
31 on another), so the verdict followed the machine. With the experiment key
`budget_in_baseline_steps` the workflow first times a few training steps of the baseline arm on
this machine (the `calibrate` job) and gives every arm the same seconds of training clock:

    budget_s           = steps x seconds_per_step        (the baseline's median over `timed_steps`)
    checkpoint_every_s = budget_s / checkpoints

Time-to-target is still measured on each arm's own clock; only the horizon and the checkpoint grid
follow the machine. The first UNTIMED_STEPS steps are not timed: they pay for allocations and warm
caches, and on 2 cores the second step still took 1.5-2x a settled one (the smoke's update: 4.96,
1.77, 1.29 s, then 1.2-1.3 s), so a mean over steps 2-4 timed 2.71 s a step against 2.19 in the runs
and "36 steps" became 45. The median of the timed steps, not their mean, since under a CPU hog single
steps took up to 2x the runs' median (4.3-10.3 s against 4.5): one slow step should not stretch
every arm's budget (docs/smoke-model.md).

The arms train side by side (two jobs at a time on two cores), and a step is slower beside another
job than alone: under a CPU hog a GRPO step took 6.68 s in the runs against 5.62 s in a calibration
that ran alone, so GRPO made 26 of its 30 steps (docs/smoke-model.md). So `side_by_side` copies of
the timed run train at once, as many as the workflow runs training jobs at once, and the budget
uses the mean step over all of them.
`budget.max_train_time_s` of the shared settings, if set, caps the budget (it is the scheduler's
time limit): a capped budget is recorded as such.

    pods-bench calibrate --config results/smoke/configs/train.yaml --set arm=grpo_n16_m16 ... \\
        --steps 60 --checkpoints 12 --side-by-side 2 --out results/smoke/calibration

writes `calibration.json` (the measurement, the machine and the resolved budget) and `train.yaml`
(the shared settings with that budget, which the training jobs read) into --out; the timed runs
stay in --out/run-<i>, each with its output in --out/run-<i>.log.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from pods_bench.config import load_config
from pods_bench.errors import PodsBenchError, require
from pods_bench.io import atomic_write_text, read_jsonl
from pods_bench.layout import CALIBRATED_CONFIG, CALIBRATION_JSON
from pods_bench.run_dir import TRAIN_LOG
from pods_bench.run_info import hardware

UNTIMED_STEPS = 2  # steps trained before the timed ones (warm-up: allocations, caches)


def timed_steps(
    config_path: Path, overrides: list[str], steps: int, run_dirs: list[Path]
) -> list[tuple[list[float], int]]:
    """Seconds of training clock of each of `steps` steps after UNTIMED_STEPS untimed ones, and the torch
    threads it ran with, for each of len(run_dirs) fresh runs of the --config file + `overrides`
    trained at once, one process each (no evaluation, no checkpoints). The processes inherit this
    one's thread settings (the workflow's calibrate rule gives them a training job's)."""
    fixed = [
        f"budget.max_steps={UNTIMED_STEPS + steps}",
        "budget.max_train_time_s=null",
        f"budget.checkpoint_every_s={1e12}",
        "budget.checkpoint_every_steps=null",
        "eval.inline=false",
    ]
    runs = []
    for run_dir in run_dirs:
        if run_dir.exists():
            shutil.rmtree(run_dir)  # a fresh measurement: resuming would skip the steps to time
        flags = [f"--set={s}" for s in [*overrides, *fixed, f"output_dir={run_dir}"]]
        log = Path(f"{run_dir}.log").open("w", encoding="utf-8")
        command = [sys.executable, "-m", "pods_bench", "train", "--config", str(config_path), *flags, "--no-progress"]
        runs.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log, run_dir))
    progress = tqdm(total=len(runs), desc=f"calibration: {len(runs)} timed run(s) side by side", unit="run")
    for process, log, _ in runs:
        process.wait()
        log.close()
        progress.update()
    progress.close()
    return [read_timed_run(run_dir, steps, process.returncode, Path(log.name)) for process, log, run_dir in runs]


def read_timed_run(run_dir: Path, steps: int, returncode: int, log: Path) -> tuple[list[float], int]:
    """One finished timed run's `steps` step times (its training clock after the UNTIMED_STEPS
    untimed steps) and torch threads, read off its train log and run.json; a run that failed
    stops the calibration with the last line of its output `log`."""
    if returncode != 0:
        tail = log.read_text(encoding="utf-8").strip().splitlines()[-1:] or ["(no output)"]
        raise PodsBenchError(f"calibration: the timed run {run_dir} failed ({log}): {tail[0]}")
    clock = [r["train_time_s"] for r in read_jsonl(run_dir / TRAIN_LOG)]
    total = UNTIMED_STEPS + steps
    require(len(clock) == total, f"calibration: the timed run logged {len(clock)} of {total} steps")
    threads = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))["hardware"]["torch_threads"]
    timed = clock[UNTIMED_STEPS - 1 :]  # the clock at the end of the last untimed step, then of each timed one
    return [after - before for before, after in zip(timed, timed[1:])], threads


def calibrate(
    config_path: str | Path,
    overrides: list[str],
    steps: int,
    checkpoints: int,
    timed: int,
    out: str | Path,
    side_by_side: int = 1,
) -> dict:
    """Time the baseline (the --config file + `overrides`), `side_by_side` runs at once, resolve
    the budget, write both files."""
    arm, settings = baseline_settings(config_path, overrides, steps, checkpoints, timed, side_by_side)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per_run = timed_steps(Path(config_path), overrides, timed, [out / f"run-{i}" for i in range(side_by_side)])
    calibration = resolve_budget(arm, per_run, steps, checkpoints, settings.get("budget", {}).get("max_train_time_s"))
    write_calibration(out, settings, calibration)
    return calibration


def baseline_settings(
    config_path: str | Path, overrides: list[str], steps: int, checkpoints: int, timed: int, side_by_side: int
) -> tuple[str, dict]:
    """The baseline's arm and the shared settings of the --config file, checked before anything runs."""
    require(
        min(steps, checkpoints, timed, side_by_side) >= 1,
        "calibration: steps, checkpoints, timed steps and side-by-side runs must be >= 1",
    )
    baseline = load_config(config_path, [*overrides, "budget.max_steps=1"])
    return baseline.arm, yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}


def resolve_budget(
    arm: str, per_run: list[tuple[list[float], int]], steps: int, checkpoints: int, cap: float | None
) -> dict:
    """calibration.json: the timed runs' (step times, torch threads), the budget of `steps` steps at
    their median, capped at `cap` (budget.max_train_time_s) if set, and its checkpoint grid."""
    seconds_per_step = statistics.median(t for times, _ in per_run for t in times)
    budget_s = steps * seconds_per_step
    capped = cap is not None and budget_s > cap
    if capped:
        budget_s = float(cap)
    return {
        "arm": arm,
        "steps": steps,
        "checkpoints": checkpoints,
        "untimed_steps": UNTIMED_STEPS,  # trained first, not timed
        "timed_steps": len(per_run[0][0]),
        "side_by_side": len(per_run),  # timed runs trained at once, as the arms train
        "step_times_s": [times for times, _ in per_run],  # one list per timed run
        "torch_threads": [threads for _, threads in per_run],  # of each timed run, as the arms' run.json
        "seconds_per_step": seconds_per_step,  # the median of step_times_s, all runs together
        "budget_s": budget_s,
        "checkpoint_every_s": budget_s / checkpoints,
        "cap_s": cap,
        "capped": capped,
        "hardware": hardware(),
    }


def write_calibration(out: Path, settings: dict, calibration: dict) -> None:
    """--out/train.yaml (the shared settings with the calibrated budget) and --out/calibration.json."""
    c = calibration
    budget = {
        **settings.get("budget", {}),
        "max_train_time_s": c["budget_s"],
        "checkpoint_every_s": c["checkpoint_every_s"],
    }
    header = (
        f"# {CALIBRATED_CONFIG}: the shared trainer settings with the budget of {c['steps']} steps of {c['arm']}\n"
        f"# at {c['seconds_per_step']:.3f} s/step on this machine, {c['side_by_side']} run(s) side by side "
        f"({CALIBRATION_JSON}; pods_bench/calibration.py)\n"
    )
    atomic_write_text(
        out / CALIBRATED_CONFIG, header + yaml.safe_dump({**settings, "budget": budget}, sort_keys=False)
    )
    atomic_write_text(out / CALIBRATION_JSON, json.dumps(calibration, indent=1) + "\n")


def cli(args) -> int:
    c = calibrate(args.config, args.set, args.steps, args.checkpoints, args.timed_steps, args.out, args.side_by_side)
    print(report(c, Path(args.out)))
    return 0


def report(c: dict, out: Path) -> str:
    """What `pods-bench calibrate` prints: the measurement, the budget, a capped budget, the files."""
    lines = [
        f"{c['arm']}: {c['seconds_per_step']:.3f} s/step (median of {c['timed_steps']} steps x {c['side_by_side']} "
        f"run(s) side by side, after {c['untimed_steps']} untimed) -> a budget of "
        f"{c['budget_s']:.1f} s ({c['steps']} steps), a checkpoint every {c['checkpoint_every_s']:.2f} s"
    ]
    if c["capped"]:
        lines.append(
            f"pods-bench calibrate: warning: the budget is capped at {c['cap_s']:g} s (budget.max_train_time_s)"
        )
    lines.append(f"wrote {out / CALIBRATION_JSON} and {out / CALIBRATED_CONFIG}")
    return "\n".join(lines)
