"""Summary tables of one experiment and writing them to `results/<experiment>/summary/`:

- speedups.csv   one row per arm: the paper's time-to-peak speedup with bootstrap CI and censoring,
                 its companions, peak accuracy, mean accuracy over the baseline's budget, s/step
- curves.csv     per arm, benchmark, metric and checkpoint time: mean over seeds, seed sd / sem,
                 95 % t-interval, and the binomial standard error of one evaluation,
                 sqrt(p (1 - p) / (n_problems x repeats)), for the accuracy metrics
- step_times.csv seconds per training step per arm, seed and phase
- speedups.md / speedups.tex  the speedup table for reading and for the paper
- verdict.md     the headline in a sentence per arm (printed at the end of a workflow run, and the
                 top of the HTML report's front page)
- cost.csv       the speedups.csv statistics on the cost axes (axis = rollouts, tokens, flops): every
                 "time" column is then completions (tokens, FLOPs) spent, so `speedup` is the
                 baseline's rollouts to reach the threshold over the arm's; empty (header only) for
                 the published logs, which do not count them
- mlperf.csv / mlperf.md  time to the fixed target `analysis.target` under MLPerf Training's rules
                 (time_to_target.py): per arm the mean of the runs' times without the fastest and the
                 slowest, evaluation on the clock and its share, and the interquartile mean with a
                 bootstrap interval; header only (the .md says why) when no target is fixed
- cost.md        the cost axes for reading: per axis and arm, the baseline's cost to reach T over the
                 arm's with crossings interpolated between checkpoints (the headline on these
                 axes: a checkpoint's grid step is a whole step's rollouts, more for the arms that
                 sample more per step), and the same to 80 % of the baseline's gain; then the
                 wasted work per step
- waste.csv      per arm, the wasted work per step as TRL and verl name it (generation batches,
                 rollouts generated and not trained, share of zero-std groups, groups discarded and
                 why): the mean over seeds of each run's mean per step; header only for the
                 published logs
- robustness.csv / robustness.md  with several warm starts (`warm_start.seeds`): each arm's verdict
                 (time to 80 % of the baseline's gain) on the runs of each starting model alone, and
                 whether it holds on every one (robustness.py); header only with one start
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import scipy.stats

from pods_bench.analysis.robustness import robustness_markdown, robustness_table
from pods_bench.analysis.speedup import GAIN_FRACTIONS, compare_arms
from pods_bench.analysis.tidy import ACCURACY_METRICS, COST_AXES, WASTE_FIELDS, Results
from pods_bench.analysis.time_to_target import MLPERF_COLUMNS, mlperf_table
from pods_bench.io import atomic_write_text, atomic_write_with

# what `aggregate` writes to <out>/<experiment>/summary/ (the outputs a workflow rule declares)
SUMMARY_FILES = (
    "speedups.csv",
    "curves.csv",
    "step_times.csv",
    "speedups.md",
    "speedups.tex",
    "cost.csv",
    "cost.md",
    "waste.csv",
    "mlperf.csv",
    "mlperf.md",
    "robustness.csv",
    "robustness.md",
    "verdict.md",
)
UNIT_SECONDS = {"s": 1.0, "min": 60.0, "h": 3600.0}
UNIT_WORDS = {"s": "seconds", "min": "minutes", "h": "hours"}


@dataclass(frozen=True)
class AnalysisOptions:
    baseline: str | None = None  # arm name; default: the experiment's GRPO arm
    q: float = 0.99
    benchmark: str | None = None  # default: the benchmark the paper reports for the setting
    metric: str | None = None  # default: answer_acc (both_acc for the published Llama runs)
    n_bootstrap: int = 9999
    seed: int = 0
    target: float | None = None  # the fixed target of the MLPerf-style table (`pods-bench target`)


@dataclass
class Summary:
    experiment: Results
    baseline: str
    benchmark: str
    metric: str
    options: AnalysisOptions
    speedups: pd.DataFrame
    curves: pd.DataFrame
    cost: pd.DataFrame  # speedups' columns on the cost axes, with `axis` first (empty without them)
    waste: pd.DataFrame  # per arm: the wasted-work fields' means per step (empty for the published logs)
    mlperf: pd.DataFrame  # time_to_target.MLPERF_COLUMNS (empty without options.target)
    robustness: pd.DataFrame  # robustness.ROBUSTNESS_COLUMNS (empty with one starting model)

    @property
    def time_unit(self) -> str:
        return time_unit(self.experiment, float(self.speedups["budget_s"].iloc[0]))


def summarize(exp: Results, options: AnalysisOptions = AnalysisOptions(), progress: bool = True) -> Summary:
    baseline, benchmark, metric = exp.resolve(options.baseline, options.benchmark, options.metric)
    compare = partial(
        compare_arms, exp, baseline, benchmark, metric, q=options.q, n_bootstrap=options.n_bootstrap, seed=options.seed
    )
    speedups = compare(progress=progress)
    mlperf = (
        pd.DataFrame(columns=MLPERF_COLUMNS)
        if options.target is None
        else mlperf_table(exp, baseline, benchmark, metric, options.target, options.n_bootstrap, options.seed)
    )
    return Summary(
        exp,
        baseline,
        benchmark,
        metric,
        options,
        speedups,
        curve_table(exp),
        cost_table(exp, compare),
        waste_table(exp),
        mlperf,
        robustness_table(exp, speedups, options.n_bootstrap, options.seed),
    )


def cost_table(exp: Results, compare) -> pd.DataFrame:
    """`compare` (compare_arms with the summary's arms and options) on the cost axes (rollouts, tokens, FLOPs),
    one block of rows per axis; no rows for an experiment whose checkpoints lack them (the published
    logs)."""
    blocks = [
        compare(progress=False, axis=axis).assign(axis=axis) for axis in COST_AXES if not exp.evals[axis].isna().any()
    ]
    if not blocks:
        return pd.DataFrame(columns=["axis"])
    cost = pd.concat(blocks, ignore_index=True)
    return cost[["axis"] + [c for c in cost.columns if c != "axis"]]


def waste_table(exp: Results) -> pd.DataFrame:
    """Per arm (display order), the mean over seeds of each run's mean per step of the wasted-work
    fields, and the seeds counted."""
    if exp.waste is None or exp.waste.empty:
        return pd.DataFrame(columns=["arm", "seeds", *WASTE_FIELDS])
    grouped = exp.waste.groupby("arm", sort=False)
    table = grouped[list(WASTE_FIELDS)].mean().join(grouped.size().rename("seeds"))
    return (
        table.reindex([a for a in exp.arm_names if a in table.index])
        .rename_axis("arm")
        .reset_index()[["arm", "seeds", *WASTE_FIELDS]]
    )


def curve_table(exp: Results) -> pd.DataFrame:
    keys = ["experiment", "arm", "benchmark", "metric", "time_s"]
    g = exp.evals.groupby(keys, sort=True)
    curves = g["value"].agg(mean="mean", sd="std", n_seeds="count").reset_index()
    curves["n_problems"] = g["n_problems"].max().to_numpy()
    curves["n_repeats"] = g["n_repeats"].median().to_numpy()
    curves["sem"] = curves["sd"] / np.sqrt(curves["n_seeds"])
    half = scipy.stats.t.ppf(0.975, curves["n_seeds"].clip(lower=2) - 1) * curves["sem"]
    is_accuracy = curves["metric"].isin(ACCURACY_METRICS)
    low, high = curves["mean"] - half, curves["mean"] + half
    curves["ci_low"] = low.where(~is_accuracy, low.clip(lower=0))  # accuracies stay in [0, 1]
    curves["ci_high"] = high.where(~is_accuracy, high.clip(upper=1))
    p = curves["mean"].clip(0, 1)
    n_answers = curves["n_problems"].astype(float) * curves["n_repeats"]
    # evaluation noise alone: one run's checkpoint, and the mean over the seeds
    curves["binomial_se"] = np.where(is_accuracy, np.sqrt(p * (1 - p) / n_answers), np.nan)
    curves["binomial_se_mean"] = curves["binomial_se"] / np.sqrt(curves["n_seeds"])
    order = {a: i for i, a in enumerate(exp.arm_names)}
    return curves.sort_values(
        ["benchmark", "metric", "arm", "time_s"],
        ignore_index=True,
        key=lambda c: c.map(order) if c.name == "arm" else c,
    )


def write_summary(summary: Summary, out_root: str | Path) -> list[Path]:
    """Write the summary files atomically to `<out_root>/<experiment>/summary/`."""
    folder = Path(out_root) / summary.experiment.name / "summary"
    tables = {
        "speedups.csv": summary.speedups,
        "curves.csv": summary.curves,
        "step_times.csv": summary.experiment.step_times,
        "cost.csv": summary.cost,
        "waste.csv": summary.waste,
        "mlperf.csv": summary.mlperf,
        "robustness.csv": summary.robustness,
    }
    paths = []
    for name, table in tables.items():
        atomic_write_with(folder / name, lambda p, t=table: t.to_csv(p, index=False))
        paths.append(folder / name)
    texts = {"speedups.md": markdown_table(summary), "speedups.tex": latex_table(summary)}
    texts["cost.md"] = cost_markdown(summary)
    texts["mlperf.md"] = mlperf_markdown(summary)
    texts["robustness.md"] = robustness_markdown(summary.robustness, summary.baseline)
    texts["verdict.md"] = "\n\n".join(verdict_lines(summary)) + "\n"
    for name, text in texts.items():
        atomic_write_text(folder / name, text)
        paths.append(folder / name)
    return paths


# --- formatting ---------------------------------------------------------------------------------


def time_unit(exp: Results, budget_s: float) -> str:
    if exp.time_unit:
        return exp.time_unit
    return "h" if budget_s >= 3 * 3600 else "min" if budget_s >= 5 * 60 else "s"


def format_time(seconds: float, unit: str) -> str:
    if not np.isfinite(seconds):
        return "never"
    value = seconds / UNIT_SECONDS[unit]
    return f"{value:.3g} {unit}"


def _ci(low, high, digits: int, scale: float = 1.0) -> str:
    return "" if pd.isna(low) else f" [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"


def format_speedup(row: pd.Series, column: str = "speedup", latex: bool = False, with_ci: bool = True) -> str:
    value, bound = row[column], row[f"{column}_bound"]
    if bound == "n/a" or pd.isna(value):
        return "n/a"
    marks = {"<": "$<$", ">=": "$\\geq$"} if latex else {"<": "<", ">=": ">="}
    text = f"{marks.get(bound, '')}{value:.2f}x"
    if with_ci and not row["is_baseline"]:
        text += _ci(row[f"{column}_ci_low"], row[f"{column}_ci_high"], 2)
    return text


class ThresholdNoise(NamedTuple):
    band: float  # T..peak: the (1 - q) x peak the paper's statistic resolves
    se_run: float  # binomial SE of the baseline's accuracy at T, one run
    se_mean: float  # the same for the mean over seeds
    seeds: int


def noise_at_threshold(summary: Summary) -> ThresholdNoise | None:
    """The baseline's evaluation noise where it reaches T, beside the band T..peak: when the band is
    the narrower, whether an arm's plateau crosses T is decided by evaluation noise."""
    r, c = summary.speedups.iloc[0], summary.curves
    at_t = c[
        (c["arm"] == summary.baseline)
        & (c["benchmark"] == summary.benchmark)
        & (c["metric"] == summary.metric)
        & (c["time_s"] == r["t_baseline_s"])
    ]
    if not len(at_t) or pd.isna(at_t["binomial_se"].iloc[0]):
        return None
    at_t = at_t.iloc[0]
    band = (1 - summary.options.q) * r["peak"]
    return ThresholdNoise(band, at_t["binomial_se"], at_t["binomial_se_mean"], int(at_t["n_seeds"]))


def verdict_lines(summary: Summary) -> list[str]:
    """The answer a user came for, a sentence per arm against the baseline: the paper's statistic
    (time to q x the baseline's peak) and the time to 80 % of the baseline's gain, with their
    intervals and the seeds they rest on."""
    s = summary.speedups
    gain = round(GAIN_FRACTIONS[1] * 100)
    base = summary.baseline
    noise = noise_at_threshold(summary)  # the baseline's, the same for every arm
    within_noise = (
        f" (the band from T to {base}'s peak, {noise.band * 100:.2f} points, is narrower than the "
        f"evaluation noise of the mean, {noise.se_mean * 100:.2f}: within noise)"
        if noise is not None and noise.band < noise.se_mean
        else ""
    )
    lines = []
    for _, r in s[~s["is_baseline"]].iterrows():
        seeds = f"over {int(r['n_seeds'])} seed{'s' * (int(r['n_seeds']) != 1)}"
        bound = r["speedup_bound"]
        if bound == "n/a" or pd.isna(r["speedup"]):
            paper = f"{r['arm']} did not reach {summary.options.q:g} x {base}'s peak within the budget ({seeds})"
        else:
            sooner = {">=": "at least ", "<": "at most "}.get(bound, "")
            paper = (
                f"{r['arm']} reached {summary.options.q:g} x {base}'s peak {sooner}{r['speedup']:.2f}x sooner"
                + _ci(r["speedup_ci_low"], r["speedup_ci_high"], 2).replace(" [", " [95 % CI ")
                + f" {seeds}"
            )
            if bound == ">=":
                paper += f" ({base} peaked at its last checkpoint: a lower bound)"
            paper += within_noise
        lines.append(f"{paper}; to {gain} % of {base}'s gain {format_speedup(r, f'speedup_gain{gain}')}.")
    return lines


def _display_table(summary: Summary, latex: bool) -> pd.DataFrame:
    s, unit = summary.speedups, summary.time_unit
    pct = "\\%" if latex else "%"
    gain = round(GAIN_FRACTIONS[1] * 100)
    rows = []
    for _, r in s.iterrows():
        rows.append(
            {
                "Arm": r["arm"] + (" (baseline)" if r["is_baseline"] else ""),
                "n/m": f"{r['n']}/{r['m']}",
                "Rule": str(r["rule"]).replace("_", " "),
                "Seeds": int(r["n_seeds"]),
                f"Peak ({pct})": f"{r['peak'] * 100:.1f}" + _ci(r["peak_ci_low"], r["peak_ci_high"], 1, 100),
                "Time to T": format_time(r["t_arm_s"], unit)
                if np.isfinite(r["t_arm_s"])
                else f"> {format_time(r['t_arm_last_s'], unit)}",
                "Speedup": format_speedup(r, latex=latex),
                "Speedup (interp.)": format_speedup(r, "speedup_interp", latex=latex),
                f"Speedup to {gain}{pct} of gain": format_speedup(r, f"speedup_gain{gain}", latex=latex),
                f"Mean acc. over budget ({pct})": f"{r['mean_over_budget'] * 100:.1f}"
                + _ci(r["mean_over_budget_ci_low"], r["mean_over_budget_ci_high"], 1, 100),
                "s/step": f"{r['seconds_per_step']:.3g}" if pd.notna(r["seconds_per_step"]) else "",
            }
        )
    return pd.DataFrame(rows)


def _side_by_side(calibration: dict) -> str:
    runs = calibration.get("side_by_side", 1)  # calibrations before it was recorded timed one run
    return f" of {runs} runs side by side, as the arms train" if runs > 1 else ""


def _statistic(calibration: dict) -> str:
    # calibrations before untimed_steps was recorded timed after one untimed step and took the mean
    return "median" if "untimed_steps" in calibration else "mean"


def _calibrated(calibration: dict | None) -> str:
    """How a budget in baseline steps was resolved on this machine (pods_bench/calibration.py)."""
    if not calibration:
        return ""
    c = calibration
    timed = f"{c['timed_steps']} step{'s' * (c['timed_steps'] != 1)}"
    text = (
        f"; set as {c['steps']} steps of {c['arm']} at {c['seconds_per_step']:.2f} s/step, timed here before the "
        f"runs ({_statistic(c)} of {timed}{_side_by_side(c)}): {c['budget_s']:.1f} s of training clock for every "
        f"arm (a run stops after the step that passes it), a checkpoint every {c['checkpoint_every_s']:.2f} s"
    )
    return text + (f", capped at {c['cap_s']:g} s" if c.get("capped") else "")


def caption(summary: Summary) -> str:
    s, r = summary.speedups, summary.speedups.iloc[0]
    exp, unit = summary.experiment, summary.time_unit
    n_boot = int(s["n_bootstrap"].max())
    text = (
        f"{exp.name}: {summary.benchmark} {summary.metric}, training on {exp.hardware}. "
        f"T = {summary.options.q:g} x peak of {summary.baseline} = {r['threshold'] * 100:.2f} %; "
        f"speedup = time for {summary.baseline} to reach T / time for the arm (first checkpoint at or above T; "
        f"{summary.baseline} reaches T at {format_time(r['t_baseline_s'], unit)}). "
        f"Budget {format_time(r['budget_s'], unit)} ({summary.baseline}'s last checkpoint)"
        f"{_calibrated(exp.calibration)}. "
        + (
            f"[95 % CI]: percentile bootstrap over seeds, {n_boot} resamples. "
            if n_boot
            else "No CIs (single seed or no resampling). "
        )
        + "'<': the arm never reaches T (upper bound); "
        "'>=': the baseline peaks at its last checkpoint (lower bound). "
        "Interp.: crossing times interpolated between checkpoints. "
        f"Gain: time to reach start + {GAIN_FRACTIONS[1]:g} x ({summary.baseline} peak - start), interpolated. "
        f"Mean acc. over budget: area under the curve / {summary.baseline}'s budget."
    )
    noise = noise_at_threshold(summary)
    if noise is not None:
        text += (
            f" Evaluation noise at T: binomial SE {noise.se_run * 100:.2f} points for one run, "
            f"{noise.se_mean * 100:.2f} for the mean of {noise.seeds} seeds; "
            f"the band T..peak is {noise.band * 100:.2f} points."
        )
    return text


def _markdown(table: pd.DataFrame) -> str:
    # the cells are formatted already: left to parse them, tabulate prints "90.0" as 90 and "1,280.0" as 1280
    return table.to_markdown(index=False, disable_numparse=True)


def markdown_table(summary: Summary) -> str:
    return f"{caption(summary)}\n\n{_markdown(_display_table(summary, latex=False))}\n"


COST_UNITS = {"rollouts": "rollouts", "tokens": "completion tokens", "flops": "FLOPs"}


def format_count(value: float) -> str:
    if not np.isfinite(value):
        return "never"
    return f"{value:,.0f}" if value < 1e6 else f"{value:.3g}"


def cost_markdown(summary: Summary) -> str:
    """cost.csv for reading: one table per cost axis, interpolated crossings as the headline."""
    cost, gain = summary.cost, round(GAIN_FRACTIONS[1] * 100)
    if cost.empty:
        return (
            f"{summary.experiment.name}: no cost axes (the checkpoints do not count rollouts, tokens or FLOPs).\n"
            + waste_markdown(summary)
        )
    parts = [
        f"{summary.experiment.name}: {summary.benchmark} {summary.metric} against what each arm spent. Per axis, "
        f"speedup = {summary.baseline}'s cost to reach T over the arm's (T as in speedups.md), the crossing "
        f"interpolated between checkpoints; to {gain} % of gain likewise for start + {GAIN_FRACTIONS[1]:g} x "
        f"({summary.baseline} peak - start). [95 % CI]: bootstrap over seeds; '<': the arm never reaches the "
        f"level (upper bound); '>=': {summary.baseline} peaks at its last checkpoint (lower bound). "
        "FLOPs: generation, update, reference and reward passes (docs/results-format.md)."
    ]
    for axis in COST_AXES:
        block = cost[cost["axis"] == axis]
        if block.empty:
            continue
        rows = [
            {
                "Arm": r["arm"] + (" (baseline)" if r["is_baseline"] else ""),
                "n/m": f"{r['n']}/{r['m']}",
                f"{COST_UNITS[axis]} to T": format_count(r["t_arm_interp_s"]),
                "Speedup to T (interp.)": format_speedup(r, "speedup_interp"),
                f"Speedup to {gain} % of gain": format_speedup(r, f"speedup_gain{gain}"),
                "Speedup to T (first checkpoint)": format_speedup(r, with_ci=False),
            }
            for _, r in block.iterrows()
        ]
        parts.append(f"### {COST_UNITS[axis]}\n\n{_markdown(pd.DataFrame(rows))}")
    return "\n\n".join(parts) + "\n" + waste_markdown(summary)


def waste_markdown(summary: Summary) -> str:
    """waste.csv for reading ("" without it): what each arm generated per step and did not train on."""
    waste = summary.waste
    if waste.empty:
        return ""
    number = lambda v, digits=1: "-" if pd.isna(v) else f"{v:,.{digits}f}"
    rows = [
        {
            "Arm": r["arm"],
            "Seeds": int(r["seeds"]),
            "Generation batches": number(r["num_gen_batches"], 2),
            "Rollouts generated": number(r["rollouts_generated"]),
            "Not trained": number(r["rollouts_not_trained"]),
            "Share not trained": "-"
            if pd.isna(r["rollouts_not_trained"]) or not r["rollouts_generated"]
            else f"{r['rollouts_not_trained'] / r['rollouts_generated']:.0%}",
            "frac_reward_zero_std": number(r["frac_reward_zero_std"], 3),
            "Groups discarded: zero std": number(r["groups_discarded_zero_std"], 2),
            "Groups discarded: surplus": number(r["groups_discarded_surplus"], 2),
            "Groups discarded: low std": number(r["groups_discarded_low_std"], 2),
        }
        for _, r in waste.iterrows()
    ]
    return (
        "\n### Wasted work per step\n\nMeans per step (each run's mean, then the mean over seeds), named as TRL and "
        "verl name them: generation batches (verl's num_gen_batches), rollouts generated but not trained "
        "(PODS's n - m per group, discarded groups, uncommitted pilots), the share of groups whose n rewards "
        "are all equal (TRL's frac_reward_zero_std), and the groups rolled out but not trained, by reason "
        "(docs/results-format.md).\n\n" + _markdown(pd.DataFrame(rows)) + "\n"
    )


def latex_table(summary: Summary) -> str:
    text = caption(summary).replace("%", "\\%").replace("_", "\\_").replace("×", "$\\times$")
    text = text.replace(">=", "$\\geq$").replace("'<'", "'$<$'")
    table = _display_table(summary, latex=True)
    table["Arm"] = table["Arm"].str.replace("_", "\\_")
    return table.to_latex(
        index=False,
        escape=False,
        caption=text,
        label=f"tab:{summary.experiment.name}",
        column_format="l" + "r" * (table.shape[1] - 1),
    )


def mlperf_markdown(summary: Summary) -> str:
    """mlperf.csv for reading, with what the convention is and where the target came from."""
    head = f"# Time to a fixed target, MLPerf Training's rules ({summary.benchmark} {summary.metric})\n\n"
    if summary.options.target is None:
        return head + (
            "No target fixed: set `analysis.target` in the experiment config to a value derived before the "
            "runs from separate baseline seeds (`pods-bench target <reference runs> --arm <baseline>`).\n"
        )
    unit, m = summary.time_unit, summary.mlperf
    rows = [
        {
            "arm": r["arm"] + (" (baseline)" if r["is_baseline"] else ""),
            "runs": f"{r['n_runs']} ({r['n_failed']} missed)",
            "MLPerf time (drop fastest + slowest)": format_time(r["olympic_time_s"], unit)
            if r["valid"]
            else "invalid (> 1 run missed)",
            "of it evaluation": "" if pd.isna(r["eval_share"]) else f"{r['eval_share'] * 100:.0f} %",
            "MLPerf speedup": "" if pd.isna(r["olympic_speedup"]) else f"{r['olympic_speedup']:.2f}x",
            "IQM time [95 % CI]": format_time(r["iqm_time_s"], unit)
            + (
                ""
                if pd.isna(r["iqm_ci_low_s"])
                else f" [{format_time(r['iqm_ci_low_s'], unit)}, {format_time(r['iqm_ci_high_s'], unit)}]"
            ),
            "IQM speedup": "" if pd.isna(r["iqm_speedup"]) else f"{r['iqm_speedup']:.2f}x",
        }
        for _, r in m.iterrows()
    ]
    return (
        head + f"Target {summary.options.target * 100:.2f} % (analysis.target; MLPerf fixes it before the timed "
        "runs, from reference runs). A run's time is its training clock at the first checkpoint at or above "
        "the target plus every evaluation up to it (MLPerf keeps evaluation on the clock); a run that never "
        "reaches the target counts as the slowest, and more than one such run invalidates the arm's result. IQM: the interquartile mean of the runs' times, "
        'percentile-bootstrap interval over runs ("never": an infinite time inside it).\n\n'
        + _markdown(pd.DataFrame(rows))
        + "\n"
    )
