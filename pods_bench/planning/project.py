"""`pods-bench project RESULTS --config CONFIG --hardware NAME`: what a finished experiment's
time-to-target would be on other hardware. A projection, labelled as one.

An arm's steps to the threshold are its measured time to the threshold over its measured seconds
per step (steps accrue at a steady rate: the analysis' time axis, with its censoring). On the
target hardware each step takes the step-time model's prediction (the target's datasheet model,
or a fitted/calibrated one with --model), so

    projected time to T = measured time to T x (predicted s/step on target / measured s/step)
    projected speedup   = measured speedup x r_baseline / r_arm,     r = predicted / measured s/step

and the bootstrap interval of the speedup scales by the same factor. The measured columns stay
beside the projected ones. Works on own runs and on the published logs (arms matched to CONFIG's
arms by n and m; their step counts come from the checkpoint names and `_step` columns).
"""

from __future__ import annotations

import math
from pathlib import Path

from pods_bench.analysis.load import load_experiments
from pods_bench.analysis.speedup import compare_arms
from pods_bench.errors import PodsBenchError
from pods_bench.experiment import hardware_setup, load_experiment, resolve_runs
from pods_bench.io import atomic_write_with
from pods_bench.planning.architecture import model_dims
from pods_bench.planning.plan import check_processes, load_step_model
from pods_bench.planning.step_time import from_hardware, predict


def arm_config(resolved: dict, arm: str, n: int, m: int):
    """The trainer config of `arm`: by name (own runs), else the one arm with its n and m (the
    published logs name arms "GRPO", "PODS n=64 m=16"); None if there is none or several."""
    if arm in resolved:
        return resolved[arm]
    same = [c for c in resolved.values() if (c.selection.n, c.selection.m) == (n, m)]
    return same[0] if len(same) == 1 else None


def project(
    results, config_path, hardware_name: str, step_model_path=None, q: float = 0.99, kind: str = "auto", only=None
):
    """Rows per (experiment, arm): measured and projected time to T, speedup and its interval."""
    hardware = hardware_setup(hardware_name)

    experiment, own = load_experiment(config_path)
    resolved = resolve_runs(experiment, own)[1]  # the arms as the config's own setup runs them
    analysis = experiment.analysis  # the baseline, benchmark and metric it names
    step_model = load_step_model(step_model_path) if step_model_path else None
    experiments, _ = load_experiments(results, kind, only=only, progress=False)
    rows = []
    for exp in experiments:
        baseline, benchmark, metric = exp.resolve(
            analysis.baseline if analysis.baseline in exp.arm_names else None,
            analysis.benchmark if exp.source != "paper" else None,
            analysis.metric if exp.source != "paper" else None,
        )
        table = compare_arms(exp, baseline, benchmark, metric, q=q, n_bootstrap=999, progress=False)
        ratios = {}
        for _, r in table.iterrows():
            spec = exp.arms.set_index("arm").loc[r["arm"]]
            cfg = arm_config(resolved, r["arm"], int(spec["n"]), int(spec["m"]))
            if cfg is None:
                raise PodsBenchError(
                    f"{exp.name}: arm {r['arm']} (n={spec['n']}, m={spec['m']}) matches no single arm of {config_path}"
                )
            check_processes(cfg, hardware, hardware_name)
            model = step_model or from_hardware(cfg, model_dims(cfg.model), hardware)
            # the model predicts a uniform step (P x G x n rollouts); strategies that sample in rounds
            # do more, by an amount only their own runs show: not projected
            uniform = cfg.allocation.strategy == "uniform"
            predicted = predict(model, cfg, hardware["processes"])["step"] if uniform else math.nan
            ratios[r["arm"]] = predicted / r["seconds_per_step"]
            rows.append(
                {
                    "experiment": exp.name,
                    "arm": r["arm"],
                    "n": int(spec["n"]),
                    "m": int(spec["m"]),
                    "measured_on": exp.hardware,
                    "measured_s_per_step": round(float(r["seconds_per_step"]), 4),
                    "measured_t_to_T_s": r["t_arm_s"],
                    "measured_speedup": r["speedup"],
                    "censored": r["censored"] if isinstance(r["censored"], str) else "",
                    "note": ""
                    if uniform
                    else f"not projected: allocation {cfg.allocation.strategy} samples in rounds",
                    "projected_on": hardware_name,
                    "projected_s_per_step": round(predicted, 4) if uniform else None,
                    "projected_t_to_T_s": r["t_arm_s"] * ratios[r["arm"]] if math.isfinite(r["t_arm_s"]) else math.inf,
                    "speedup_ci_low": r.get("speedup_ci_low"),
                    "speedup_ci_high": r.get("speedup_ci_high"),
                    "step_time_source": model.source,
                }
            )
        base_ratio = ratios[baseline]
        if not math.isfinite(base_ratio):
            raise PodsBenchError(f"{exp.name}: the baseline {baseline} cannot be projected (allocation not uniform)")
        for row in rows:
            if row["experiment"] == exp.name:
                factor = base_ratio / ratios[row["arm"]]
                row["projected_speedup"] = row["measured_speedup"] * factor  # NaN where not projected
                for end in ("low", "high"):
                    value = row.pop(f"speedup_ci_{end}")
                    row[f"projected_speedup_ci_{end}"] = (
                        value * factor if value is not None and value == value else None
                    )
    return rows


def markdown(rows: list[dict]) -> str:
    head = "| experiment | arm | n/m | measured s/step | measured speedup | projected on | projected s/step | projected time to T | projected speedup [CI] |"
    lines = [head, "|" + " --- |" * 9]
    for r in rows:
        ci = (
            f" [{r['projected_speedup_ci_low']:.2f}, {r['projected_speedup_ci_high']:.2f}]"
            if r["projected_speedup_ci_low"] is not None
            else ""
        )
        bound = "<" if r["censored"].startswith("arm never") else ""
        if r["note"]:
            lines.append(
                f"| {r['experiment']} | {r['arm']} | {r['n']}/{r['m']} | {r['measured_s_per_step']} | "
                f"{bound}{r['measured_speedup']:.2f}x | {r['projected_on']} | {r['note']} | | |"
            )
            continue
        lines.append(
            f"| {r['experiment']} | {r['arm']} | {r['n']}/{r['m']} | {r['measured_s_per_step']} | {bound}{r['measured_speedup']:.2f}x | "
            f"{r['projected_on']} | {r['projected_s_per_step']} | {r['projected_t_to_T_s']:.4g} s | {bound}{r['projected_speedup']:.2f}x{ci} |"
        )
    return "\n".join(lines) + "\n"


def cli(args) -> int:
    import pandas as pd

    rows = project(args.results, args.config, args.hardware, args.model, args.q, args.kind, args.experiment)
    print(f"projection (not a measurement) of {args.results} onto {args.hardware}")
    print(markdown(rows))
    if args.out:
        atomic_write_with(Path(args.out), lambda tmp: pd.DataFrame(rows).to_csv(tmp, index=False))
        print(f"wrote {args.out}")
    return 0
