"""`pods-bench profile CONFIG --out DIR [--fit A,B]`: time a few steps of every arm of an experiment
config on this machine, fit the step-time model on some arms and check its predictions on the others.

The arms are trained exactly as the workflow's jobs would train them (same resolved configs), for
`steps` steps each, in `rounds` interleaved rounds (arm 1, arm 2, ..., arm 1 again: a resumed run
continues where it stopped), so that a machine that slows down or speeds up meanwhile touches every
arm alike. No evaluation; checkpoints only where a round ends. Writes:

    DIR/runs/<arm>/            the runs (train_log.jsonl: the per-phase times and their features)
    DIR/step_time_model.json   the coefficients fitted on the --fit arms (`pods-bench plan --model`)
    DIR/validation.csv, .md    every arm's measured mean step time beside the model's predictions
    DIR/memory.csv, .md        with --memory: every arm's update memory measured beside the plan's
                               (planning/measure_memory.py; one measurement per distinct update shape)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pods_bench.config import config_from_dict
from pods_bench.errors import PodsBenchError
from pods_bench.experiment import arm_overrides, load_experiment, shared_train_settings
from pods_bench.io import atomic_write_json, atomic_write_text, atomic_write_with, read_jsonl
from pods_bench.layout import RUNS
from pods_bench.planning.measure_memory import measure_update
from pods_bench.planning.memory import trained_per_process
from pods_bench.planning.step_time import StepLengths, StepTimeModel, fit, predict
from pods_bench.run_dir import PHASES, TRAIN_LOG, phase_field
from pods_bench.run_info import hardware
from pods_bench.train import train


def arm_configs(config_path, out: Path, check_model: bool = True) -> dict:
    """Arm -> (trainer settings, its overrides, what it sets beyond n, m and the rule) for profiling
    runs in out/runs/<arm>."""
    experiment, hardware = load_experiment(config_path)
    if hardware["processes"] > 1:
        raise PodsBenchError("pods-bench profile times one process; choose a one-process hardware setup")
    settings = shared_train_settings(experiment, hardware)
    model = Path(settings.get("model", {}).get("name", ""))
    if check_model and experiment.warm_start.enabled and not (model / "config.json").is_file():
        raise PodsBenchError(
            f"the warm-started model {model} does not exist yet: run `pods-bench pretrain --out {model}`"
        )
    fixed = [
        f"seed={experiment.seeds[0]}",
        "budget.max_train_time_s=null",
        f"budget.checkpoint_every_s={1e12}",
        "eval.inline=false",
    ]
    return {
        arm: (
            settings,
            [*arm_overrides(experiment, arm), f"output_dir={out / 'runs' / arm}", *fixed],
            ", ".join(f"{key}={value}" for key, value in spec.set.items()),
        )
        for arm, spec in experiment.arms.items()
    }


def interleaved_schedule(arms, steps: int, rounds: int) -> list[tuple[str, int]]:
    """(arm, the step its run trains up to), in training order: every round takes every arm in turn,
    round r up to steps * r // rounds steps (a resumed run continues where it stopped)."""
    return [(arm, steps * r // rounds) for r in range(1, rounds + 1) for arm in arms]


def run_interleaved(arms: dict, steps: int, rounds: int) -> None:
    from tqdm import tqdm

    for arm, max_steps in tqdm(interleaved_schedule(arms, steps, rounds), desc="profile", unit="run"):
        settings, overrides, _ = arms[arm]
        train(config_from_dict(settings, [*overrides, f"budget.max_steps={max_steps}"]), progress=False)


def arm_records(out: Path, arm: str) -> list[dict]:
    return read_jsonl(out / RUNS / arm / TRAIN_LOG)


def validation_rows(out: Path, arms: dict, model: StepTimeModel, fitted: list[str]) -> list[dict]:
    """Per arm: measured mean step time, the prediction from its config alone (lengths of the fitted
    arms, within its limits) and from its own measured lengths (the phase model's error without the
    length guess). `role`: fitted, or what the held-out arm changes (n and m; a setting)."""
    rows = []
    for arm, (settings, overrides, changes) in arms.items():
        cfg = config_from_dict(settings, [*overrides, "budget.max_steps=1"])
        records = arm_records(out, arm)
        measured = float(np.mean([sum(r[phase_field(p)] for p in PHASES) for r in records]))
        from_config = predict(model, cfg)["step"]
        own = predict(model, cfg, lengths=StepLengths.from_records(records))["step"]
        rows.append(
            {
                "arm": arm,
                "n": cfg.selection.n,
                "m": cfg.selection.m,
                "role": "fitted" if arm in fitted else f"held out: {changes or 'n, m'}",
                "steps": len(records),
                "measured_s": round(measured, 4),
                "predicted_s": round(from_config, 4),
                "error_pct": round(100 * (from_config - measured) / measured, 1),
                "predicted_own_lengths_s": round(own, 4),
                "error_own_lengths_pct": round(100 * (own - measured) / measured, 1),
            }
        )
    return rows


def memory_rows(arms: dict) -> list[dict]:
    """Per arm: the update's measured peak beside the plan's (MiB). Arms whose updates have the same
    shape (rows, prompt and completion lengths, micro-batch) share one measurement."""
    measured: dict[tuple, dict] = {}
    rows = []
    for arm, (settings, overrides, _) in arms.items():
        cfg = config_from_dict(settings, [*overrides, "budget.max_steps=1"])
        shape = (
            trained_per_process(cfg, 1),
            cfg.task.max_prompt_tokens,
            cfg.sampling.max_new_tokens,
            cfg.optim.micro_batch_size,
        )
        if shape not in measured:
            measured[shape] = measure_update(settings, [*overrides, "budget.max_steps=1"])
        m = measured[shape]
        rows.append(
            {
                "arm": arm,
                "n": cfg.selection.n,
                "m": cfg.selection.m,
                "rows": m["rows"],
                "prompt_tokens": m["prompt"],
                "completion_tokens": m["completion"],
                "measured_mib": round(m["measured"] / 2**20, 1),
                "planned_mib": round(m["planned"] / 2**20, 1),
                "error_pct": round(100 * (m["planned"] - m["measured"]) / m["measured"], 1),
            }
        )
    return rows


def memory_markdown(rows: list[dict]) -> str:
    head = "| arm | n/m | rows x (prompt + completion) | measured MiB | planned MiB | error |"
    lines = [head, "|" + " --- |" * 6]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['n']}/{r['m']} | {r['rows']} x ({r['prompt_tokens']} + {r['completion_tokens']}) | "
            f"{r['measured_mib']} | {r['planned_mib']} | {r['error_pct']:+.1f} % |"
        )
    return "\n".join(lines) + "\n"


def profile_memory(config_path, out) -> list[dict]:
    """memory_rows for every arm of the config; writes DIR/memory.csv and memory.md."""
    out = Path(out)
    rows = memory_rows(arm_configs(config_path, out))
    write_rows(out, "memory", rows, memory_markdown)
    return rows


def profile(config_path, out, fit_arms: list[str] | None, steps: int, rounds: int):
    """(model, validation rows); writes the files of the module docstring."""
    out = Path(out)
    arms, fitted = profile_arms(config_path, out, fit_arms, steps, rounds)
    run_interleaved(arms, steps, rounds)
    return fit_and_validate(config_path, out, arms, fitted)


def profile_arms(config_path, out: Path, fit_arms: list[str] | None, steps: int, rounds: int):
    """(arm_configs, the arms to fit on: all by default), the arguments checked before anything trains."""
    arms = arm_configs(config_path, out)
    fitted = fit_arms or list(arms)
    unknown = [a for a in fitted if a not in arms]
    if unknown:
        raise PodsBenchError(f"--fit: no arm {unknown[0]!r} in {config_path}; choose from {', '.join(arms)}")
    if steps < rounds or rounds < 1:
        raise PodsBenchError(f"--steps ({steps}) must be >= --rounds ({rounds}) >= 1")
    return arms, fitted


def fit_and_validate(config_path, out: Path, arms: dict, fitted: list[str]):
    """(model, validation rows): the step-time model fitted on the `fitted` arms' runs in out/runs,
    checked on every arm; writes out/step_time_model.json and out/validation.csv, .md."""
    records = [r for arm in fitted for r in arm_records(out, arm)]
    source = f"profile of {config_path} on {hardware()['label']}, fitted on {', '.join(fitted)}"
    model = fit(records, source)
    rows = validation_rows(out, arms, model, fitted)
    atomic_write_json(out / "step_time_model.json", model.to_dict())
    write_rows(out, "validation", rows, validation_markdown)
    return model, rows


def write_rows(out: Path, name: str, rows: list[dict], markdown) -> None:
    """out/<name>.csv and, for reading, out/<name>.md (markdown(rows))."""
    import pandas as pd

    atomic_write_with(out / f"{name}.csv", lambda tmp: pd.DataFrame(rows).to_csv(tmp, index=False))
    atomic_write_text(out / f"{name}.md", markdown(rows))


def validation_markdown(rows: list[dict]) -> str:
    head = (
        "| arm | n/m | role | steps | measured s/step | predicted (config) | error | predicted (own lengths) | error |"
    )
    lines = [head, "|" + " --- |" * 9]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['n']}/{r['m']} | {r['role']} | {r['steps']} | {r['measured_s']} | {r['predicted_s']} | "
            f"{r['error_pct']:+.1f} % | {r['predicted_own_lengths_s']} | {r['error_own_lengths_pct']:+.1f} % |"
        )
    return "\n".join(lines) + "\n"


def cli(args) -> int:
    fit_arms = [a.strip() for a in args.fit.split(",") if a.strip()] if args.fit else None
    model, rows = profile(args.config, args.out, fit_arms, args.steps, args.rounds)
    print(validation_markdown(rows))
    print(json.dumps(model.coefficients, indent=1))
    print(f"wrote {Path(args.out) / 'step_time_model.json'} and validation.csv / validation.md")
    if args.memory:
        print(memory_markdown(profile_memory(args.config, args.out)))
        print(f"wrote {Path(args.out) / 'memory.csv'} and memory.md")
    return 0
