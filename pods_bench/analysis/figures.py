"""Figures of one experiment, PNG and PDF, in `figures/<experiment>/`:

- accuracy.{png,pdf}: test accuracy vs training time, mean over seeds with its 95 % band, per arm; the
  threshold T and each arm's first checkpoint at or above it; beside it, seconds per training step
  (stacked by phase for own runs).
- accuracy-<family>.{png,pdf}: the same for each group of arms that varies one thing (n-scaling,
  m-scaling, selection rule) when the experiment holds more arms than that group.
- length.{png,pdf}: mean completion length vs training time.
- accuracy-rollouts.{png,pdf}: test accuracy vs rollouts generated (pilots, refill rounds and dropped
  groups included), with the threshold and each arm's rollout speedup (own runs only: the published
  logs do not count rollouts).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import scipy.stats  # noqa: E402
import seaborn as sns  # noqa: E402

from pods_bench.analysis.tables import UNIT_SECONDS, UNIT_WORDS, Summary, format_speedup, format_time  # noqa: E402
from pods_bench.analysis.tidy import LENGTH_METRIC, PHASES  # noqa: E402
from pods_bench.io import atomic_write_with  # noqa: E402

BENCHMARK_NAMES = {"gsm8k": "GSM8K", "math500": "MATH-500", "amc23": "AMC23", "math": "MATH"}
METRIC_NAMES = {"answer_acc": "accuracy", "both_acc": "answer + format accuracy", "format_acc": "format accuracy"}


def plot_experiment(summary: Summary, out_root: str | Path) -> list[Path]:
    """Draw every figure of the experiment; returns the files written."""
    exp = summary.experiment
    folder = Path(out_root) / exp.name
    n = len(exp.arm_names)
    colors = dict(zip(exp.arm_names, sns.color_palette("colorblind" if n <= 10 else "husl", max(n, 3))))
    with plt.rc_context():  # the theme applies to these figures only
        sns.set_theme(context="paper", style="whitegrid", font_scale=1.25)
        paths = _save(accuracy_figure(summary, exp.arm_names, colors), folder / "accuracy")
        for family, arms in arm_families(exp.arms, summary.baseline).items():
            paths += _save(accuracy_figure(summary, arms, colors, title=family), folder / f"accuracy-{family}")
        if not _curves(summary, LENGTH_METRIC).empty:
            paths += _save(length_figure(summary, colors), folder / "length")
        if (summary.cost["axis"] == "rollouts").any():
            paths += _save(cost_figure(summary, colors, "rollouts"), folder / "accuracy-rollouts")
    return paths


def arm_families(arms: pd.DataFrame, baseline: str) -> dict[str, list[str]]:
    """Groups of down-sampling arms that differ in one thing, each with the baseline first:
    n-scaling (same m and rule), m-scaling (same n and rule), rule (same n and m)."""
    selecting = arms[arms["n"] != arms["m"]]
    found = []
    for kind, keys, vary in (
        ("n-scaling", ["m", "rule"], "n"),
        ("m-scaling", ["n", "rule"], "m"),
        ("rule", ["n", "m"], "rule"),
    ):
        for key, group in selecting.groupby(keys, sort=False):  # arms keep their display order
            if group[vary].nunique() >= 2:
                members = [baseline] + [a for a in group["arm"] if a != baseline]
                label = f"{keys[0]}{key[0]}" if kind != "rule" else f"n{key[0]}-m{key[1]}"
                if len(members) >= 3 and set(members) != set(arms["arm"]):
                    found.append((kind, label, members))
    kinds = [kind for kind, _, _ in found]
    return {(kind if kinds.count(kind) == 1 else f"{kind}-{label}"): members for kind, label, members in found}


def _time_label(summary: Summary) -> str:
    return f"Training time ({UNIT_WORDS[summary.time_unit]}) on {summary.experiment.hardware}"


def _curves(summary: Summary, metric: str) -> pd.DataFrame:
    c = summary.curves
    return without_partial_bands(c[(c["benchmark"] == summary.benchmark) & (c["metric"] == metric)])


def without_partial_bands(curves: pd.DataFrame) -> pd.DataFrame:
    """No band where only some of an arm's seeds have a checkpoint (the last one, when the seeds'
    clocks end a little apart): the legend names the band over all seeds, and over 2 seeds a
    t-interval spans most of the axis."""
    partial = curves["n_seeds"] < curves.groupby("arm")["n_seeds"].transform("max")
    return curves.assign(ci_low=curves["ci_low"].mask(partial), ci_high=curves["ci_high"].mask(partial))


def _draw_curves(ax, curves: pd.DataFrame, arms: list[str], colors: dict, scale: float, unit: str, labels: dict):
    for arm in arms:
        c = curves[curves["arm"] == arm]
        x = c["time_s"] / UNIT_SECONDS[unit]
        ax.plot(
            x, c["mean"] * scale, marker="o", markersize=3.5, lw=1.6, color=colors[arm], label=labels.get(arm, arm)
        )
        ax.fill_between(x, c["ci_low"] * scale, c["ci_high"] * scale, color=colors[arm], alpha=0.18, lw=0)


def accuracy_figure(summary: Summary, arms: list[str], colors: dict, title: str | None = None):
    """Accuracy vs training time (left), a zoom on the threshold where the curves span far more
    than the band around it (middle, its region boxed on the left), seconds per step (right)."""
    exp, unit, s = summary.experiment, summary.time_unit, summary.speedups.set_index("arm")
    curves = _curves(summary, summary.metric)
    shown = curves[curves["arm"].isin(arms)]
    after = shown[shown["time_s"] > 0]
    # y range: when the base model sits far below the trained checkpoints (further than their own
    # spread), show the checkpoints after the start and note where the start is
    # (a single seed has no band: NaN limits are skipped)
    low, high = after[["mean", "ci_low"]].min().min() * 100, after[["mean", "ci_high"]].max().max() * 100
    start = shown[shown["time_s"] == 0]["mean"].min() * 100
    clip_start = start < low - (high - low)
    if not clip_start:
        low = min(low, shown[["mean", "ci_low"]].min().min() * 100)
    pad = 0.06 * (high - low)
    threshold = s.loc[summary.baseline, "threshold"] * 100
    window = (threshold - 3.0, after["mean"].max() * 100 + 1.0)
    zoomed = high - low > 5 * (window[1] - window[0])  # the crossings would be a few pixels apart

    legend_rows = -(-(len(arms) + 2) // 2)  # the legend sits below: make room for it
    widths = [2.2, 1.1, 1] if zoomed else [2.2, 1]
    fig, axes = plt.subplots(
        1,
        len(widths),
        figsize=(11 + 3.8 * zoomed, 3.9 + 0.22 * legend_rows),
        width_ratios=widths,
        layout="constrained",
    )
    ax, ax_bars = axes[0], axes[-1]

    _draw_curves(ax, curves, arms, colors, 100, unit, _threshold_labels(s, arms, unit))
    ax.set_ylim(low - pad, high + pad)
    if clip_start:
        ax.annotate(
            f"start {start:.1f} % (below)",
            xy=(0, low - pad),
            xytext=(4, 4),
            textcoords="offset points",
            fontsize=9,
            color="0.35",
        )
    crossings = {arm: s.loc[arm, "t_arm_s"] / UNIT_SECONDS[unit] for arm in arms}
    _mark_threshold(
        ax,
        threshold,
        crossings,
        colors,
        low - pad,
        label=f"T = {summary.options.q:g} × {summary.baseline} peak = {threshold:.2f} %; ◆ first checkpoint ≥ T",
    )
    ax.set_xlim(left=0)
    _name_band(ax, int(shown["n_seeds"].max()))

    if zoomed:
        _draw_zoom(ax, axes[1], curves, arms, colors, unit, threshold, crossings, window)
    ax.set_xlabel(_time_label(summary))
    ax.set_ylabel(
        f"{BENCHMARK_NAMES.get(summary.benchmark, summary.benchmark)} "
        f"{METRIC_NAMES.get(summary.metric, summary.metric)} (%)"
    )
    if title:
        ax.set_title(f"{exp.name}: {title}", loc="left", fontsize=11)

    _draw_step_times(ax_bars, summary, arms, colors)
    handles, texts = ax.get_legend_handles_labels()
    fig.legend(handles, texts, loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    return fig


def _threshold_labels(s: pd.DataFrame, arms: list[str], unit: str) -> dict[str, str]:
    """Legend labels: when each arm first reaches T, and its speedup."""
    labels = {}
    for arm in arms:
        r = s.loc[arm]
        reached = f"T at {format_time(r['t_arm_s'], unit)}" if np.isfinite(r["t_arm_s"]) else "T not reached"
        labels[arm] = (
            f"{arm} (baseline): {reached}"
            if r["is_baseline"]
            else f"{arm}: {reached}, {format_speedup(r, with_ci=False)}"
        )
    return labels


def _draw_zoom(ax, zoom, curves, arms, colors, unit: str, threshold: float, crossings: dict, window: tuple):
    """The middle panel: the curves near T, from a little before the first crossing; its region boxed on `ax`."""
    _draw_curves(zoom, curves, arms, colors, 100, unit, {})
    _mark_threshold(zoom, threshold, crossings, colors, window[0])
    first = min((t for t in crossings.values() if np.isfinite(t)), default=0.0)
    right = ax.get_xlim()[1]
    zoom.set_xlim(max(0.0, first - 0.25 * (right - first)), right)
    zoom.set_ylim(*window)
    zoom.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(5))
    zoom.set_title("near T (the box on the left)", fontsize=10)
    zoom.set_xlabel(UNIT_WORDS[unit].capitalize())
    x0, x1 = zoom.get_xlim()
    ax.indicate_inset((x0, window[0], x1 - x0, window[1] - window[0]), edgecolor="0.4")


def cost_figure(summary: Summary, colors: dict, axis: str = "rollouts"):
    """Accuracy vs what was generated up to each checkpoint (`axis`: rollouts or tokens)."""
    exp = summary.experiment
    x_of = exp.evals[["arm", "time_s", axis]].drop_duplicates(["arm", "time_s"])
    curves = _curves(summary, summary.metric).merge(x_of, on=["arm", "time_s"])
    cost = summary.cost[summary.cost["axis"] == axis].set_index("arm")
    fig, ax = plt.subplots(figsize=(8, 4.2 + 0.22 * -(-len(exp.arm_names) // 2)), layout="constrained")
    for arm in exp.arm_names:
        c, r = curves[curves["arm"] == arm].sort_values(axis), cost.loc[arm]
        # the interpolated crossing: the headline on a cost axis (tables.cost_markdown)
        speedup = format_speedup(r, "speedup_interp", with_ci=False)
        label = f"{arm} (baseline)" if r["is_baseline"] else f"{arm}: {speedup}"
        ax.plot(c[axis], c["mean"] * 100, marker="o", markersize=3.5, lw=1.6, color=colors[arm], label=label)
        ax.fill_between(c[axis], c["ci_low"] * 100, c["ci_high"] * 100, color=colors[arm], alpha=0.18, lw=0)
    threshold = cost.loc[summary.baseline, "threshold"] * 100
    ax.axhline(
        threshold,
        ls="--",
        lw=1,
        color="0.3",
        label=f"T = {summary.options.q:g} × {summary.baseline} peak; speedup: {axis} to T, interpolated",
    )
    _name_band(ax, int(curves["n_seeds"].max()))
    ax.set_xlim(left=0)
    ax.set_xlabel(f"{axis.capitalize()} generated (pilots, refill rounds and dropped groups included)")
    ax.set_ylabel(
        f"{BENCHMARK_NAMES.get(summary.benchmark, summary.benchmark)} "
        f"{METRIC_NAMES.get(summary.metric, summary.metric)} (%)"
    )
    handles, texts = ax.get_legend_handles_labels()
    fig.legend(handles, texts, loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    return fig


def _name_band(ax, seeds: int) -> None:
    """A legend entry for the curves' shaded bands (one seed has none)."""
    if seeds > 1:
        ax.fill_between(
            [], [], [], color="0.55", alpha=0.3, lw=0, label=f"band: 95 % t-interval of the mean over {seeds} seeds"
        )


def _mark_threshold(ax, threshold: float, crossings: dict[str, float], colors: dict, bottom: float, label=None):
    """The threshold line, and a dotted drop line and diamond at each arm's first checkpoint >= T."""
    ax.axhline(threshold, ls="--", lw=1, color="0.3", label=label)
    for arm, x in crossings.items():
        if np.isfinite(x):
            ax.vlines(x, bottom, threshold, colors=[colors[arm]], linestyles=":", lw=1.4)
            ax.plot([x], [threshold], marker="D", markersize=6, color=colors[arm], markeredgecolor="black", zorder=5)


def _draw_step_times(ax, summary: Summary, arms: list[str], colors: dict):
    """Horizontal bars of mean seconds per step (stacked by phase when phases were logged), with
    the 95 % t-interval of the total over seeds."""
    st = summary.experiment.step_times
    y = np.arange(len(arms))[::-1]
    phases = [p for p in PHASES if p in set(st["phase"])]
    totals = []
    for arm in arms:
        v = st[(st["arm"] == arm) & (st["phase"] == "total")]["seconds_per_step"]
        half = scipy.stats.t.ppf(0.975, len(v) - 1) * v.std() / np.sqrt(len(v)) if len(v) > 1 else 0.0
        totals.append((v.mean() if len(v) else np.nan, half))
    if phases:
        left = np.zeros(len(arms))
        palette = dict(zip(PHASES, sns.color_palette("Set2", len(PHASES))))
        for phase in phases:
            width = np.array([st[(st["arm"] == a) & (st["phase"] == phase)]["seconds_per_step"].mean() for a in arms])
            width = np.nan_to_num(width)
            ax.barh(y, width, left=left, color=palette[phase], label=phase, height=0.6)
            left += width
    else:
        ax.barh(y, [t for t, _ in totals], color=[colors[a] for a in arms], height=0.6)
    ax.errorbar(
        [t for t, _ in totals],
        y,
        xerr=[h for _, h in totals],
        fmt="none",
        ecolor="black",
        capsize=3,
        lw=1,
        label="total: 95 % t-interval over seeds",
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2, frameon=False)
    ax.set_yticks(y, arms)
    ax.set_xlabel("Seconds per training step")  # on the machine the left panel names
    ax.grid(axis="y", visible=False)


def length_figure(summary: Summary, colors: dict):
    arms = summary.experiment.arm_names
    curves = _curves(summary, LENGTH_METRIC)
    fig, ax = plt.subplots(figsize=(11, 3.8), layout="constrained")
    _draw_curves(ax, curves, arms, colors, 1, summary.time_unit, {})
    ax.set_xlim(left=0)
    ax.set_xlabel(_time_label(summary))
    ax.set_ylabel(f"Mean completion length\non {BENCHMARK_NAMES.get(summary.benchmark, summary.benchmark)} (tokens)")
    fig.legend(loc="outside right upper", fontsize=9, frameon=False)
    return fig


def _save(fig, stem: Path) -> list[Path]:
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        # tight: the layout engine can leave an axis label past the edge (the strategies figure's
        # y label, with twelve arms' legend below it); the saved image grows to hold every artist
        atomic_write_with(path, lambda p: fig.savefig(p, dpi=200, bbox_inches="tight", pad_inches=0.05))
    plt.close(fig)
    return paths
