"""Load own runs (the results contract) and pick the right loader for a folder.

Own runs live in `results/<experiment>/runs/<arm>/seed<k>/` with `run.json`, `train_log.jsonl`
(one line per step) and `eval.jsonl` (one line per checkpoint x benchmark, with one value per
evaluation repeat). The format is described in docs/results-format.md; run.json's
`config.selection` gives the rule (n and m also come from train_log.jsonl) and `hardware.label`
names the hardware in figures.

Checkpoint grid: seeds of an arm are compared checkpoint by checkpoint. The k-th evaluated
checkpoint of every seed (k = 0 is the start point at step 0) is placed at the median over the arm's
seeds of their k-th checkpoint times, so that time-triggered checkpoints that fire a little late,
or step-triggered ones whose times vary from seed to seed, still line up. `raw_time_s` keeps each
run's own time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from pods_bench.analysis import paper_logs
from pods_bench.analysis.tidy import (
    ACCURACY_METRICS,
    COST_AXES,
    EVAL_COLUMNS,
    LENGTH_METRIC,
    START_COLUMNS,
    STEP_TIME_COLUMNS,
    WASTE_COLUMNS,
    WASTE_FIELDS,
    Results,
    arm_table,
)
from pods_bench.errors import PodsBenchError
from pods_bench.io import read_jsonl
from pods_bench.layout import CALIBRATION, CALIBRATION_JSON, RUNS, SEED_PREFIX
from pods_bench.run_dir import EVAL_LOG, PHASE_LABELS, PHASES, RUN_JSON, TRAIN_LOG, load_run_json, phase_field

# train_log.jsonl field -> phase of a training step
PHASE_FIELDS = {phase_field(p): PHASE_LABELS[p] for p in PHASES}
# where else a config may keep the selection rule (the trainer's is config.selection.rule)
RULE_KEYS = ("selection_rule", "rule")


def load_experiments(
    path: str | Path, kind: str = "auto", only: list[str] | None = None, progress: bool = True
) -> tuple[list[Results], list[str]]:
    """Load an experiment folder (`<experiment>/runs/...`), a folder of experiment folders, or a
    folder of the paper's published logs (`kind` = "runs", "paper" or "auto" to detect).
    Returns the experiments and one warning per skipped file or run; raises PodsBenchError
    when nothing at all could be loaded."""
    path = Path(path)
    if not path.exists():
        raise PodsBenchError(f"{path}: no such folder")
    if kind == "auto":
        kind = (
            "runs"
            if (path / RUNS).is_dir() or _experiment_dirs(path)
            else "paper"
            if paper_logs.find_logs_folder(path)
            else None
        )
        if kind is None:
            raise PodsBenchError(f"{path}: neither an experiment folder (with runs/) nor the published PODS logs")
    if kind == "paper":
        experiments, warnings = paper_logs.load_paper_logs(path, progress=progress)
        names = [e.name for e in experiments]
    elif kind == "runs":
        folders = [path] if (path / RUNS).is_dir() else _experiment_dirs(path)
        names, experiments, warnings = [f.name for f in folders], [], []
        for folder in folders:
            if not only or folder.name in only:
                experiments.append(load_runs(folder, warnings, progress=progress))
        experiments = [e for e in experiments if e is not None]
    else:
        raise PodsBenchError(f"unknown kind {kind!r} (use auto, runs or paper)")
    if only and (unknown := sorted(set(only) - set(names))):
        raise PodsBenchError(f"{path}: no experiment {', '.join(unknown)} (there are: {', '.join(names)})")
    experiments = [e for e in experiments if not only or e.name in only]
    if not experiments:
        detail = ""
        if warnings:  # the first reason, on the one line the error gets
            detail = f": {warnings[0]}" + (f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else "")
        raise PodsBenchError(f"{path}: nothing could be loaded{detail}")
    return experiments, warnings


def _experiment_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if (p / RUNS).is_dir()) if path.is_dir() else []


def load_runs(experiment_dir: Path, warnings: list[str], progress: bool = True) -> Results | None:
    """One experiment from its runs; unreadable runs are skipped with a warning."""
    seed_dirs = sorted(experiment_dir.glob(f"{RUNS}/*/{SEED_PREFIX}*"))
    rows, step_rows, waste_rows, start_rows, arms, hardware = [], [], [], [], [], []
    for seed_dir in tqdm(
        seed_dirs, desc=f"reading {experiment_dir.name}", unit="run", disable=None if progress else True
    ):
        try:
            run = _read_run(seed_dir, warnings)
        except PodsBenchError as e:
            warnings.append(f"{seed_dir}: skipped ({e})")
            continue
        rows += run["evals"]
        step_rows += run["step_times"]
        waste_rows.append(run["waste"])
        start_rows.append(run["start"])
        arms.append(run["arm"])
        hardware.append(run["hardware"])
    if not rows:
        if not seed_dirs:
            warnings.append(f"{experiment_dir}: no runs/<arm>/seed<k> folders")
        return None
    evals = pd.DataFrame(rows).assign(experiment=experiment_dir.name)
    evals = _align_checkpoints(evals, warnings)[EVAL_COLUMNS]
    arms = arm_table(arms)
    names = list(arms["arm"])
    baseline = next((a for a in names if a.lower() == "grpo"), None) or next(
        (a for a, n, m in zip(names, arms["n"], arms["m"]) if n == m), names[0]
    )
    benchmarks = sorted(evals["benchmark"].unique())
    return Results(
        name=experiment_dir.name,
        evals=evals,
        step_times=pd.DataFrame(step_rows, columns=STEP_TIME_COLUMNS).assign(experiment=experiment_dir.name),
        arms=arms,
        hardware=" / ".join(dict.fromkeys(hardware)),
        source="runs",
        default_benchmark="gsm8k" if "gsm8k" in benchmarks else benchmarks[0],
        default_baseline=baseline,
        calibration=_calibration(experiment_dir, warnings),
        waste=pd.DataFrame(waste_rows, columns=WASTE_COLUMNS).assign(experiment=experiment_dir.name),
        starts=pd.DataFrame(start_rows, columns=START_COLUMNS),
    )


def _calibration(experiment_dir: Path, warnings: list[str]) -> dict | None:
    """The experiment's calibration.json (a budget in baseline steps), if it has one."""
    path = experiment_dir / CALIBRATION / CALIBRATION_JSON
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        warnings.append(f"{path}: not valid JSON ({e.msg}, line {e.lineno}); the caption leaves it out")
        return None


def _align_checkpoints(evals: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """time_s = median over an arm's seeds of the k-th checkpoint's time (see module docstring)."""
    evals = evals.sort_values(["arm", "seed", "benchmark", "metric", "step"], ignore_index=True)
    k = evals.groupby(["arm", "seed", "benchmark", "metric"]).cumcount()
    same = evals.groupby([evals["arm"], evals["benchmark"], evals["metric"], k])["raw_time_s"]
    evals["time_s"] = same.transform("median")
    for axis in COST_AXES:  # the same grid on the cost axes: median over seeds
        evals[axis] = evals.groupby([evals["arm"], evals["benchmark"], evals["metric"], k])[f"raw_{axis}"].transform(
            "median"
        )
    # seeds whose k-th checkpoints lie far apart (one missed an evaluation) are compared wrongly
    spread = same.transform("max") - same.transform("min")
    for arm, rows in evals.assign(spread=spread).groupby("arm"):
        spacing = np.median(np.diff(np.unique(rows["time_s"]))) if rows["time_s"].nunique() > 1 else np.inf
        if rows["spread"].max() > 0.5 * spacing:
            warnings.append(
                f"arm {arm}: the seeds' k-th checkpoints differ by up to {rows['spread'].max():.3g} s "
                f"(checkpoints every ~{spacing:.3g} s): a seed may lack an evaluation"
            )
    return evals


def _read_jsonl_tolerating_torn_tail(path: Path, warnings: list[str]) -> list[dict]:
    """A torn last line is what a crash mid-write leaves: drop it with a warning. Any other bad
    line is an error naming the file and line."""
    try:
        return read_jsonl(path)
    except PodsBenchError:
        records = read_jsonl(path, drop_torn_tail=True)
        warnings.append(f"{path}: dropped a truncated last line")
        return records


def _read_run(seed_dir: Path, warnings: list[str]) -> dict:
    arm = seed_dir.parent.name
    try:
        seed = int(seed_dir.name.removeprefix("seed"))
    except ValueError:
        raise PodsBenchError("folder name is not seed<k>") from None
    run_json = load_run_json(seed_dir / RUN_JSON)
    if run_json is None:
        raise PodsBenchError(f"no {RUN_JSON}")
    eval_path, log_path = seed_dir / EVAL_LOG, seed_dir / TRAIN_LOG
    if not eval_path.exists():
        raise PodsBenchError(f"no {EVAL_LOG}")
    records = _read_jsonl_tolerating_torn_tail(eval_path, warnings)
    if not records:
        raise PodsBenchError(f"{EVAL_LOG} is empty")
    steps = _read_jsonl_tolerating_torn_tail(log_path, warnings) if log_path.exists() else []

    spent = _cumulative_cost(steps)
    evals = {}
    for i, r in enumerate(records, start=1):
        try:
            base = dict(
                arm=arm,
                seed=seed,
                step=int(r["step"]),
                raw_time_s=float(r["train_time_s"]),
                benchmark=str(r["benchmark"]),
                n_problems=int(r["n_problems"]),
                eval_time_s=np.nan
                if r.get("eval_time_s") is None
                else float(r["eval_time_s"]),  # logs written before it was recorded: NaN
            )
            base.update(zip((f"raw_{axis}" for axis in COST_AXES), spent.get(base["step"], (np.nan,) * 3)))
        except (KeyError, TypeError, ValueError) as e:
            raise PodsBenchError(f"{eval_path}: line {i} lacks a valid {e}") from None
        for metric in (*ACCURACY_METRICS, LENGTH_METRIC):
            if r.get(metric) is None:
                continue
            values = np.atleast_1d(np.asarray(r[metric], dtype=float))
            # a re-evaluated checkpoint (resume) replaces the earlier line
            evals[(base["step"], base["benchmark"], metric)] = dict(
                base, metric=metric, value=float(values.mean()), n_repeats=len(values)
            )

    config = run_json.get("config") or {}
    selection = config.get("selection") if isinstance(config.get("selection"), dict) else {}
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    n = _first(steps, "n") or selection.get("n") or _find_key(config, ("n",))
    m = _first(steps, "m") or selection.get("m") or _find_key(config, ("m",))
    if n is None or m is None:
        raise PodsBenchError("neither train_log.jsonl nor run.json config gives n and m")
    rule = selection.get("rule") or _find_key(config, RULE_KEYS)
    rule = rule if isinstance(rule, str) else ("all" if n == m else "unknown")
    return dict(
        evals=list(evals.values()),
        step_times=_step_times(steps, arm, seed),
        waste=dict(arm=arm, seed=seed, **_waste_per_step(steps)),
        # the model it started from (a warm start's folder): summary/robustness.md compares the arms on each
        start=dict(arm=arm, seed=seed, start=str(model.get("name", ""))),
        arm=dict(arm=arm, n=int(n), m=int(m), rule=rule),
        hardware=hardware_label(run_json.get("hardware")),
    )


def _cumulative_cost(steps: list[dict]) -> dict[int, tuple[float, float, float]]:
    """step -> (completions, completion tokens, FLOPs) spent up to and including it (0 at step 0).
    Logs written before `rollouts_generated` existed give P x G x n per step; before the FLOPs were
    counted, NaN FLOPs."""
    out, rollouts, tokens, flops = {0: (0.0, 0.0, 0.0)}, 0.0, 0.0, 0.0
    for r in sorted(steps, key=lambda r: r["step"]):
        generated = r.get("rollouts_generated")
        if generated is None:
            generated = r.get("prompts", 0) * r.get("groups_per_prompt", 1) * r.get("n", 0)
        rollouts, tokens = rollouts + generated, tokens + r.get("generated_tokens", 0)
        flops += sum(r.get(f"flops_{phase}", np.nan) for phase in ("gen", "update", "reference", "reward"))
        out[int(r["step"])] = (rollouts, tokens, flops)
    return out


def _waste_per_step(steps: list[dict]) -> dict[str, float]:
    """The run's mean per step of each wasted-work field (tidy.WASTE_FIELDS); the groups a DAPO-style
    filter discarded count the trainer's `selection.filter_uniform_groups` (groups_trained -
    prompts_kept) beside a strategy's own; a strategy without a kind of discard logs 0 of it."""
    if not steps:
        return dict.fromkeys(WASTE_FIELDS, np.nan)
    log = pd.DataFrame(steps)
    if {"groups_trained", "prompts_kept"} <= set(log):
        filtered = log["groups_trained"] - log["prompts_kept"]
        log["groups_discarded_zero_std"] = log.get("groups_discarded_zero_std", 0) + filtered
        for reason in ("groups_discarded_surplus", "groups_discarded_low_std"):
            log[reason] = log.get(reason, 0)
    return {f: float(log[f].mean()) if f in log else np.nan for f in WASTE_FIELDS}


def _step_times(steps: list[dict], arm: str, seed: int) -> list[dict]:
    """Mean seconds per step of each phase, `other` = the rest of the step's wall time."""
    if not steps:
        return []
    log = pd.DataFrame(steps).sort_values("step")
    total = float(np.diff(np.r_[0.0, log["train_time_s"].to_numpy(float)]).mean())
    phases = {phase: float(log[f].mean()) for f, phase in PHASE_FIELDS.items() if f in log}
    phases["other"] = max(total - sum(phases.values()), 0.0)
    return [dict(arm=arm, seed=seed, phase=p, seconds_per_step=v) for p, v in {"total": total, **phases}.items()]


def _first(records: list[dict], key: str):
    return records[0].get(key) if records else None


def _find_key(tree, keys: tuple[str, ...]):
    """First value stored under one of `keys` in a nested dict, searched breadth first."""
    queue = [tree]
    while queue:
        node = queue.pop(0)
        if isinstance(node, dict):
            for key in keys:
                if key in node and not isinstance(node[key], dict):
                    return node[key]
            queue += [v for v in node.values() if isinstance(v, dict)]
    return None


def hardware_label(hardware) -> str:
    """The hardware's name for axis labels: run.json's `hardware.label` (e.g. "8×NVIDIA H100 80GB
    HBM3" or "AMD EPYC 7B13 (2 threads)"), else its CPU."""
    if isinstance(hardware, dict):
        for key in ("label", "cpu"):
            if hardware.get(key):
                return re.sub(r"\b1 threads\b", "1 thread", str(hardware[key]))  # as runs before 2026-12 wrote it
    return "unknown hardware"
