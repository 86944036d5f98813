"""Importer for the paper's published logs (the official repository's `results/` folder).

Two formats, both turned into the tidy table of `tidy.py`, one `Results` per setting:

1. Single-GPU runs, one JSON file per seed:
   `Instruct-<DATASET>[-<RULE>]-<max completion length>-<n>-<m>[-<lr or beta>]-Run<seed>.json`
   RULE absent = max-variance, `MaxR` = max-reward, `Rand` = random; n == m is vanilla GRPO.
   Each file maps `checkpoint-<global step>` to {benchmark: {ans_acc, for_acc, both_acc, lengths:
   [one value per evaluation repeat], examples}}. Checkpoints were taken every 30 minutes of training
   (10 minutes for Llama), so the i-th checkpoint in step order is at (i + 1) x interval; like the
   paper's plotting script we keep those within the setting's budget (6 h; 1.5 h for Llama).
   `base-qwen.json` / `base-llama.json` hold the base model's results: time 0 for every run.
2. Multi-GPU exports of the experiment tracker, `<prefix>-acc.csv` and `<prefix>-length.csv` (prefix
   `h100s` = 8 x H100, `a100s` = 8 x A100): column `eval/time` (training seconds) and per run
   `data/<run> - _step`, `... - eval/rewards/accuracy_reward/mean` (or `eval/completions/mean_length`),
   with run names `GRPO-s<seed>-p<prompts>-n<n>-m<m>-ga<grad. accumulation>` (`GR7B-...` on A100s).
   Runs evaluated about every 2 minutes at their own times; like the paper we align every run to a
   0, 2, ..., 30 minute grid by taking its evaluation nearest to each grid time, and like its plot
   scripts we keep only the runs that have all of accuracy, `_step` and length (the A100 export has
   two runs with only one of the two files).

Evaluation set sizes are not in the logs; `infer_sample_count` recovers them from the accuracies
themselves (each is k / N for N graded answers), which the binomial standard errors need.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from pods_bench.analysis.tidy import (
    COST_AXES,
    EVAL_COLUMNS,
    STEP_TIME_COLUMNS,
    Results,
    arm_table,
    grpo_or_pods_name,
)
from pods_bench.errors import PodsBenchError


@dataclass(frozen=True)
class SingleGpuSetting:
    experiment: str
    base_file: str  # base-model results, used as time 0
    checkpoint_every_s: float
    budget_s: float
    benchmark: str  # the benchmark and metric the paper reports for this setting
    metric: str
    time_unit: str = "h"  # for display
    usual_extra: str | None = None  # the lr/beta suffix all published runs of this setting carry


@dataclass(frozen=True)
class MultiGpuSetting:
    experiment: str
    hardware: str
    grid_step_s: float
    budget_s: float
    benchmark: str = "gsm8k"


SINGLE_GPU_HARDWARE = "one L40S"
SINGLE_GPU_SETTINGS = {  # DATASET token of the file name -> setting
    "GSM8K": SingleGpuSetting("gsm8k-l40s-qwen", "base-qwen.json", 1800, 6 * 3600, "gsm8k", "answer_acc"),
    "MATH-NF": SingleGpuSetting("math-l40s-qwen", "base-qwen.json", 1800, 6 * 3600, "math500", "answer_acc"),
    # the paper reports answer-and-format accuracy for Llama (its base model rarely follows the format)
    "Llama": SingleGpuSetting(
        "gsm8k-l40s-llama",
        "base-llama.json",
        600,
        1.5 * 3600,
        "gsm8k",
        "both_acc",
        time_unit="min",
        usual_extra="0.04",
    ),
}
MULTI_GPU_SETTINGS = {  # file prefix -> setting
    "h100s": MultiGpuSetting("h100-gsm8k", "8×H100", 120, 1800),
    "a100s": MultiGpuSetting("a100-gsm8k", "8×A100", 120, 1800),
}
RULES = {None: "max_variance", "MaxR": "max_reward", "Rand": "random"}
JSON_METRICS = {"ans_acc": "answer_acc", "for_acc": "format_acc", "both_acc": "both_acc", "lengths": "mean_length"}
CSV_METRICS = {"eval/rewards/accuracy_reward/mean": "answer_acc", "eval/completions/mean_length": "mean_length"}

SINGLE_GPU_FILE = re.compile(
    r"^Instruct-(?P<dataset>" + "|".join(map(re.escape, SINGLE_GPU_SETTINGS)) + r")"
    r"(?:-(?P<rule>MaxR|Rand))?-(?P<maxlen>\d+)-(?P<n>\d+)-(?P<m>\d+)"
    r"(?:-(?P<extra>\d[\w.+-]*?))?-Run(?P<seed>\d+)\.json$"
)
MULTI_GPU_FILE = re.compile(r"^(?P<prefix>[A-Za-z0-9]+)-(?P<kind>acc|length)\.csv$")
RUN_COLUMN = re.compile(
    r"^data/(?P<run>[A-Za-z0-9]+-s(?P<seed>\d+)-p\d+-n(?P<n>\d+)-m(?P<m>\d+)-ga(?P<ga>\d+)) - (?P<key>.+)$"
)


def find_logs_folder(path: Path) -> Path | None:
    """The folder holding the published files: `path` itself or its `results/` subfolder."""
    for folder in (path, path / "results"):
        if folder.is_dir() and any(
            SINGLE_GPU_FILE.match(p.name) or MULTI_GPU_FILE.match(p.name) or p.name.startswith("Instruct-")
            for p in folder.iterdir()
        ):
            return folder
    return None


def infer_sample_count(values, max_count: int = 10_000) -> int | None:
    """Smallest N such that every accuracy is a multiple of 1/N (the number of graded answers
    behind each value), or None if there is none up to `max_count`."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None
    for n in range(1, max_count + 1):
        scaled = v * n
        if np.all(np.abs(scaled - np.round(scaled)) < 1e-6):
            return n
    return None


def load_paper_logs(path: str | Path, progress: bool = True) -> tuple[list[Results], list[str]]:
    """Read every published log under `path`; returns the experiments (one per setting) and one
    warning per file that was skipped."""
    folder = find_logs_folder(Path(path))
    if folder is None:
        raise PodsBenchError(f"{path}: no published PODS logs (Instruct-*.json or <prefix>-acc.csv) found")
    warnings: list[str] = []
    groups: dict[str, _Group] = {}
    files = sorted(p for p in folder.iterdir() if p.is_file())
    csv_prefixes = set()
    for file in tqdm(files, desc="reading published logs", unit="file", disable=None if progress else True):
        if file.suffix not in (".json", ".csv") or file.name.startswith("base-"):
            continue  # licence, notes, and the base-model files (read with their setting)
        if match := SINGLE_GPU_FILE.match(file.name):
            try:
                _read_single_gpu_file(file, match, groups)
            except (PodsBenchError, OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                warnings.append(f"{file}: skipped ({_reason(e)})")
        elif match := MULTI_GPU_FILE.match(file.name):
            csv_prefixes.add(match["prefix"])
        else:
            warnings.append(
                f"{file}: skipped (file name does not follow the published patterns "
                "Instruct-<DATASET>[-<RULE>]-<len>-<n>-<m>[-<extra>]-Run<k>.json or <prefix>-acc.csv)"
            )
    for prefix in sorted(csv_prefixes):
        try:
            _read_multi_gpu_export(folder, prefix, groups, warnings)
        except (PodsBenchError, OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
            warnings.append(f"{folder / (prefix + '-acc.csv')}: skipped ({_reason(e)})")
    experiments = [g.finish(warnings) for _, g in sorted(groups.items())]
    return [e for e in experiments if e is not None], warnings


def _reason(error: Exception) -> str:
    return str(error).split("\n")[0] if not isinstance(error, json.JSONDecodeError) else f"not valid JSON: {error.msg}"


class _Group:
    """Rows of one experiment while its files are being read."""

    def __init__(self, name, hardware, time_unit, benchmark, metric, base_file=None, folder=None):
        self.name, self.hardware, self.time_unit = name, hardware, time_unit
        self.benchmark, self.metric = benchmark, metric
        self.base_file, self.folder = base_file, folder
        self.rows: list[dict] = []
        self.step_rows: list[dict] = []
        self.arms: list[dict] = []
        self.raw_accuracies: dict[str, list[float]] = {}  # benchmark -> every repeat's accuracy
        self.runs: set[tuple[str, int]] = set()

    def add_run(self, arm, n, m, rule, seed, rows, raw, seconds_per_step):
        self.arms.append(dict(arm=arm, n=n, m=m, rule=rule))
        self.runs.add((arm, seed))
        for r in rows:
            self.rows.append(dict(r, experiment=self.name, arm=arm, seed=seed))
        for bench, values in raw.items():
            self.raw_accuracies.setdefault(bench, []).extend(values)
        self.step_rows.append(
            dict(experiment=self.name, arm=arm, seed=seed, phase="total", seconds_per_step=seconds_per_step)
        )

    def finish(self, warnings: list[str]) -> Results | None:
        if not self.rows:
            return None
        if self.base_file is not None:
            self._add_base_rows(warnings)
        evals = pd.DataFrame(self.rows)
        counts = {b: infer_sample_count(v) for b, v in self.raw_accuracies.items()}
        evals["n_problems"] = evals["benchmark"].map(counts).astype("Int64")
        for axis in (*COST_AXES, "eval_time_s"):  # the published logs do not count them
            evals[axis] = float("nan")
        evals = evals[EVAL_COLUMNS].sort_values(["arm", "seed", "benchmark", "metric", "time_s"], ignore_index=True)
        arms = arm_table(self.arms)
        grpo = arms[arms["n"] == arms["m"]]["arm"]
        return Results(
            name=self.name,
            evals=evals,
            step_times=pd.DataFrame(self.step_rows, columns=STEP_TIME_COLUMNS),
            arms=arms,
            hardware=self.hardware,
            source="paper",
            default_benchmark=self.benchmark,
            default_metric=self.metric,
            default_baseline=grpo.iloc[0] if len(grpo) else None,
            time_unit=self.time_unit,
        )

    def _add_base_rows(self, warnings):
        path = self.folder / self.base_file
        if not path.exists():
            warnings.append(f"{path}: not found, so the {self.name} curves start at the first checkpoint")
            return
        try:
            base_rows, raw = _checkpoint_rows(json.loads(path.read_text(encoding="utf-8")))
        except (PodsBenchError, json.JSONDecodeError, UnicodeDecodeError) as e:
            warnings.append(f"{path}: skipped ({_reason(e)}), so the {self.name} curves start at the first checkpoint")
            return
        for arm, seed in sorted(self.runs):  # every run starts from the same base model at time 0
            for r in base_rows:
                self.rows.append(dict(r, experiment=self.name, arm=arm, seed=seed, time_s=0.0, raw_time_s=0.0, step=0))
        for bench, values in raw.items():
            self.raw_accuracies.setdefault(bench, []).extend(values)


def _checkpoint_rows(results: dict) -> tuple[list[dict], dict[str, list[float]]]:
    """Rows (benchmark, metric, value, n_repeats) of one checkpoint's {benchmark: {metric: [..]}}."""
    if not isinstance(results, dict) or not results:
        raise PodsBenchError("a checkpoint has no benchmark results")
    rows, raw = [], {}
    for bench, block in results.items():
        if not isinstance(block, dict):
            raise PodsBenchError(f"results of {bench!r} are not a mapping")
        for key, metric in JSON_METRICS.items():
            values = block.get(key)
            if not values:
                continue
            values = [float(v) for v in (values if isinstance(values, list) else [values])]
            rows.append(dict(benchmark=bench, metric=metric, value=float(np.mean(values)), n_repeats=len(values)))
            if metric != "mean_length":
                raw.setdefault(bench, []).extend(values)
    if not rows:
        raise PodsBenchError(f"no {'/'.join(JSON_METRICS)} results")
    return rows, raw


def _read_single_gpu_file(path: Path, match: re.Match, groups: dict) -> None:
    setting = SINGLE_GPU_SETTINGS[match["dataset"]]
    n, m, maxlen, extra = int(match["n"]), int(match["m"]), int(match["maxlen"]), match["extra"]
    # runs with another completion length or lr/beta than the published ones form their own experiment
    name = (
        setting.experiment
        + ("" if maxlen == 512 else f"-len{maxlen}")
        + ("" if extra in (None, setting.usual_extra) else f"-{extra}")
    )
    log = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(log, dict) or not log:
        raise PodsBenchError("no checkpoints in the file")
    try:
        checkpoints = sorted(log, key=lambda k: int(k.rsplit("-", 1)[-1]))
    except ValueError:
        raise PodsBenchError("checkpoint names are not checkpoint-<step>") from None
    rows, raw = [], {}
    last = None
    for i, checkpoint in enumerate(checkpoints):
        time_s = (i + 1) * setting.checkpoint_every_s
        if time_s > setting.budget_s:
            break
        step = int(checkpoint.rsplit("-", 1)[-1])
        ckpt_rows, ckpt_raw = _checkpoint_rows(log[checkpoint])
        rows += [dict(r, time_s=time_s, raw_time_s=time_s, step=step) for r in ckpt_rows]
        for bench, values in ckpt_raw.items():
            raw.setdefault(bench, []).extend(values)
        last = (time_s, step)
    if last is None:
        raise PodsBenchError("no checkpoint within the setting's budget")
    group = groups.setdefault(
        name,
        _Group(
            name,
            SINGLE_GPU_HARDWARE,
            setting.time_unit,
            setting.benchmark,
            setting.metric,
            base_file=setting.base_file,
            folder=path.parent,
        ),
    )
    rule = "all" if n == m else RULES[match["rule"]]
    group.add_run(
        grpo_or_pods_name(n, m, rule),
        n,
        m,
        rule,
        int(match["seed"]),
        rows,
        raw,
        seconds_per_step=last[0] / last[1] if last[1] > 0 else np.nan,
    )


def _read_multi_gpu_export(folder: Path, prefix: str, groups: dict, warnings: list[str]) -> None:
    acc_path, length_path = folder / f"{prefix}-acc.csv", folder / f"{prefix}-length.csv"
    if prefix not in MULTI_GPU_SETTINGS:
        raise PodsBenchError(f"unknown export prefix {prefix!r} (known: {', '.join(MULTI_GPU_SETTINGS)})")
    if not acc_path.exists():
        raise PodsBenchError(f"{prefix}-length.csv has no {prefix}-acc.csv beside it")
    setting = MULTI_GPU_SETTINGS[prefix]
    grid = np.arange(0.0, setting.budget_s + 1e-9, setting.grid_step_s)
    # run name -> {"seed", "n", "m", "ga", "columns": {(file name, key)}, metric: (times, steps, values)}
    runs: dict[str, dict] = {}
    # the official plot scripts keep a seed only if it has all three columns, e.g. scripts/plot-a100s.py
    # at 187f43b, line 103: seeds=set(acc_runs[alg]) & set(step_runs[alg]) & set(len_runs[alg])
    required = {acc_path.name: ("eval/rewards/accuracy_reward/mean", "_step")}
    for path in (acc_path, length_path):
        if not path.exists():
            continue
        try:
            _read_export_csv(path, runs)
        except PodsBenchError as e:
            if path is acc_path:
                raise
            warnings.append(f"{path}: skipped ({e})")
        else:
            if path is length_path:  # without a readable length file the import stays accuracy-only
                required[path.name] = ("eval/completions/mean_length",)
    group = groups.setdefault(
        setting.experiment, _Group(setting.experiment, setting.hardware, "min", setting.benchmark, "answer_acc")
    )
    for run, info in sorted(runs.items()):
        missing = [
            f"{key} in {file}" for file, keys in required.items() for key in keys if (file, key) not in info["columns"]
        ]
        if missing or "answer_acc" not in info:
            warnings.append(
                f"{folder / prefix}: run {run} skipped (no "
                f"{', no '.join(missing) or 'row with both accuracy and _step'}; "
                "the paper's plots use only runs with accuracy, _step and length)"
            )
            continue
        rows, raw = [], {setting.benchmark: list(info["answer_acc"][2])}
        for metric in ("answer_acc", "mean_length"):
            if metric not in info:
                continue
            times, steps, values = info[metric]
            if np.isnan(steps).any():  # the length file lacks this run's _step: take the accuracy file's
                acc_times, acc_steps, _ = info["answer_acc"]
                steps = acc_steps[np.abs(acc_times[None, :] - times[:, None]).argmin(axis=1)]
            nearest = np.abs(times[None, :] - grid[:, None]).argmin(axis=1)  # the paper's alignment
            rows += [
                dict(
                    time_s=g,
                    raw_time_s=times[i],
                    step=int(steps[i]),
                    benchmark=setting.benchmark,
                    metric=metric,
                    value=values[i],
                    n_repeats=1,
                )
                for g, i in zip(grid, nearest)
            ]
        times, steps, _ = info["answer_acc"]
        at_budget = steps[np.abs(times - setting.budget_s).argmin()]
        n, m = info["n"], info["m"]
        rule = "all" if n == m else "max_variance"
        # the logged step counts micro-batches: an optimizer step is `ga` of them
        group.add_run(
            grpo_or_pods_name(n, m, rule),
            n,
            m,
            rule,
            info["seed"],
            rows,
            raw,
            seconds_per_step=setting.budget_s / (at_budget / info["ga"]) if at_budget > 0 else np.nan,
        )


def _read_export_csv(path: Path, runs: dict) -> None:
    table = pd.read_csv(path)
    if "eval/time" not in table.columns:
        raise PodsBenchError("no 'eval/time' column")
    time = pd.to_numeric(table["eval/time"], errors="coerce")
    columns: dict[str, dict[str, str]] = {}
    for column in table.columns:
        if (match := RUN_COLUMN.match(column)) and not match["key"].endswith(("__MIN", "__MAX")):
            runs.setdefault(
                match["run"], dict(seed=int(match["seed"]), n=int(match["n"]), m=int(match["m"]), ga=int(match["ga"]))
            )
            columns.setdefault(match["run"], {})[match["key"]] = column
    if not columns:
        raise PodsBenchError("no run columns named 'data/<run> - <key>'")
    for run, keys in columns.items():
        present = {key for key, column in keys.items() if table[column].notna().any()}  # an empty column is none
        runs[run].setdefault("columns", set()).update((path.name, key) for key in present)
        # without its _step a series is still kept (the official scripts do not need the length file's)
        steps = (
            pd.to_numeric(table[keys["_step"]], errors="coerce")
            if "_step" in present
            else pd.Series(np.nan, index=table.index)
        )
        for key, metric in CSV_METRICS.items():
            if key not in present:
                continue
            values = pd.to_numeric(table[keys[key]], errors="coerce")
            ok = values.notna() & time.notna() & (steps.notna() if "_step" in present else True)
            if ok.any():
                runs[run][metric] = (time[ok].to_numpy(float), steps[ok].to_numpy(float), values[ok].to_numpy(float))
