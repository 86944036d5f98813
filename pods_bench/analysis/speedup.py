"""Time-to-peak speedup (the paper's headline statistic), its noise-robust companions, and
bootstrap confidence intervals over seeds.

Per arm X with checkpoint grid t_0 = 0 < t_1 < ... and seeds s (a = mean over evaluation repeats):

    c_X(t)  = mean_s a_{X,s}(t)                      the arm's curve
    T       = q * max_{t>0} c_base(t)                threshold, q = 0.99 in the paper
    t_X     = min{ t > 0 : c_X(t) >= T }             first grid time at or above T
    speedup = t_base / t_X                           (the paper: 2.00x on GSM8K / L40S, 1.71x on 8xH100)

Beside it, never instead of it (at small scale the 1 % band of q = 0.99 is inside evaluation noise):
    interpolated:  t_X linearly interpolated between the grid points around the crossing
    gain fraction: level_f = c_base(0) + f * (max_{t>0} c_base - c_base(0)), f = 0.5, 0.8, 0.9;
                   speedup_f = t_base(level_f) / t_X(level_f), both interpolated
    mean accuracy over the baseline's budget B: (1/B) * integral_0^B c_X(t) dt (trapezoid; the
                   area under the accuracy-time curve in accuracy units)

Censoring: if the arm never reaches T, t_X is only known to exceed the arm's last checkpoint, so the
speedup is reported as an upper bound "<" t_base / t_last. If the baseline's curve peaks at its last
checkpoint, the baseline was still improving and its time to peak is right-censored: the speedup is
reported as a lower bound ">=" (and "n/a" when both happen).

Confidence intervals: seeds are resampled with replacement (scipy.stats.bootstrap, percentile
method, seeded) and the whole statistic, threshold included, is recomputed on every resample. An arm
with the baseline's seeds is paired with it (paired=True: a resample draws seed k of both), because
the workflow trains the arms of one seed side by side (`pair_seeds`, docs/workflow.md) and seed k
of every arm shares the initialisation and the prompt order: what seed k's machine conditions and
data did to both cancels in their ratio. Other arms are resampled independently (paired=False); the
`paired_seeds` column says which was done. A resample in which the arm never reaches the level counts
as speedup 0 (the limit of t_base / t_X as t_X grows), so every resample gives a number and the
percentile interval is well defined; a lower limit of 0 therefore means "in at least 2.5 % of
resamples the arm never got there". Arms with a single seed get no interval.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.stats
from scipy.integrate import trapezoid
from tqdm.auto import tqdm

from pods_bench.analysis.tidy import Results
from pods_bench.errors import PodsBenchError

GAIN_FRACTIONS = (0.5, 0.8, 0.9)


@dataclass(frozen=True)
class ArmCurves:
    """One arm's values of one benchmark and metric, seeds x checkpoint grid."""

    arm: str
    times: np.ndarray  # (G,) seconds, ascending
    values: np.ndarray  # (S, G), NaN where a seed has no such checkpoint
    seeds: tuple = ()  # the S seeds, in the order of the rows of values

    @property
    def n_seeds(self) -> int:
        return self.values.shape[0]

    def curve(self, seeds: np.ndarray | None = None) -> np.ndarray:
        """Mean over seeds: (G,), or (B, G) for a batch of resampled seed indices (B, S)."""
        v = self.values if seeds is None else self.values[seeds]
        with warnings.catch_warnings():  # an all-NaN column (no seed reached it) stays NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean(v, axis=-2)


def arm_curves(evals: pd.DataFrame, arm: str, benchmark: str, metric: str, axis: str = "time_s") -> ArmCurves:
    """The arm's values on the x-axis column `axis` (time_s; rollouts or tokens: tidy.AXES)."""
    rows = evals[(evals["arm"] == arm) & (evals["benchmark"] == benchmark) & (evals["metric"] == metric)]
    if rows.empty:
        raise PodsBenchError(f"arm {arm!r} has no {benchmark} {metric} evaluations")
    if rows[axis].isna().any():
        raise PodsBenchError(f"arm {arm!r} has checkpoints without {axis} (a run whose train_log.jsonl is missing)")
    table = rows.pivot_table(index="seed", columns=axis, values="value", aggfunc="mean").sort_index(axis=1)
    return ArmCurves(arm, table.columns.to_numpy(float), table.to_numpy(float), tuple(table.index))


# --- the statistics, vectorized over a batch of curves (B, G) ----------------------------------


def first_crossing(times: np.ndarray, curves: np.ndarray, level: np.ndarray, interpolate: bool = False) -> np.ndarray:
    """First time t > 0 with curve >= level, per row; inf where never. With `interpolate`, the
    time on the straight line between the previous grid point and the crossing one."""
    hit = (curves >= level[:, None]) & (times > 0)  # NaN compares False
    reached = hit.any(axis=1)
    k = hit.argmax(axis=1)
    t = np.where(reached, times[k], np.inf)
    if interpolate:
        rows = np.arange(len(k))
        prev = np.maximum(k - 1, 0)
        y0, y1 = curves[rows, prev], curves[rows, k]
        with np.errstate(divide="ignore", invalid="ignore"):
            # t = t0 + (level - y0) / (y1 - y0) * (t1 - t0), clipped to the segment
            frac = np.clip(np.where(y1 > y0, (level - y0) / (y1 - y0), 1.0), 0.0, 1.0)
        frac = np.where(np.isnan(frac), 1.0, frac)
        t_interp = times[prev] + frac * (times[k] - times[prev])
        t = np.where(reached & (k > 0), t_interp, t)
    return t


def mean_over_budget(times: np.ndarray, curves: np.ndarray, budget: float) -> np.ndarray:
    """(1 / budget) * integral of the curve from its first grid time to `budget` (trapezoid);
    NaN for curves that stop before the budget."""
    if times[-1] < budget - 1e-9:
        return np.full(curves.shape[0], np.nan)
    budget = min(budget, float(times[-1]))  # up to 1e-9 past the last grid time (rounding): that time
    inside = times < budget
    j = int(np.searchsorted(times, budget))
    w = 1.0 if times[j] == budget else (budget - times[j - 1]) / (times[j] - times[j - 1])
    end = (1 - w) * curves[:, j - 1] + w * curves[:, j] if w < 1.0 else curves[:, j]
    t = np.r_[times[inside], budget]
    y = np.concatenate([curves[:, inside], end[:, None]], axis=1)
    return trapezoid(y, t, axis=1) / (budget - t[0])


def ratio(t_base: np.ndarray, t_arm: np.ndarray) -> np.ndarray:
    """t_base / t_arm, with the arm never reaching the level (inf) counting as speedup 0; NaN
    where the baseline never reaches it either (the level is undefined)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isinf(t_base), np.nan, np.where(np.isinf(t_arm), 0.0, t_base / t_arm))


def pair_statistics(
    base: ArmCurves,
    base_curve: np.ndarray,
    arm: ArmCurves,
    arm_curve: np.ndarray,
    q: float,
    gain_fractions=GAIN_FRACTIONS,
) -> dict[str, np.ndarray]:
    """Every statistic of an arm against the baseline, for curves (B, G); each value is (B,)."""
    after_start = base.times > 0
    peak_base = np.nanmax(base_curve[:, after_start], axis=1)
    threshold = q * peak_base
    s = dict(
        threshold=threshold,
        peak_base=peak_base,
        peak_arm=np.nanmax(arm_curve[:, arm.times > 0], axis=1),
        t_base=first_crossing(base.times, base_curve, threshold),
        t_arm=first_crossing(arm.times, arm_curve, threshold),
        t_base_interp=first_crossing(base.times, base_curve, threshold, interpolate=True),
        t_arm_interp=first_crossing(arm.times, arm_curve, threshold, interpolate=True),
    )
    s["speedup"] = ratio(s["t_base"], s["t_arm"])
    s["speedup_interp"] = ratio(s["t_base_interp"], s["t_arm_interp"])
    start = base_curve[:, 0]
    for f in gain_fractions:
        key = f"gain{round(f * 100)}"
        gain = peak_base - start
        level = np.where(gain > 0, start + f * gain, np.nan)  # no gain, no fraction of it
        s[f"{key}_level"] = level
        s[f"t_base_{key}"] = first_crossing(base.times, base_curve, level, interpolate=True)
        s[f"t_arm_{key}"] = first_crossing(arm.times, arm_curve, level, interpolate=True)
        s[f"speedup_{key}"] = ratio(s[f"t_base_{key}"], s[f"t_arm_{key}"])
    # Own runs stop once the clock passes the budget, so arms end up to a step apart: compare both
    # over the common window when the arm covers at least 95 % of the baseline's budget.
    common = min(base.times[-1], arm.times[-1])
    budget = common if common >= 0.95 * base.times[-1] else base.times[-1]
    s["mean_base"] = mean_over_budget(base.times, base_curve, budget)
    s["mean_arm"] = mean_over_budget(arm.times, arm_curve, budget)
    s["mean_diff"] = s["mean_arm"] - s["mean_base"]
    return s


def arm_statistics(arm: ArmCurves, curve: np.ndarray, budget: float) -> dict[str, np.ndarray]:
    """Statistics of one arm on its own: peak after the start, mean accuracy over `budget`."""
    return dict(
        peak_arm=np.nanmax(curve[:, arm.times > 0], axis=1), mean_arm=mean_over_budget(arm.times, curve, budget)
    )


def bootstrap_ci(
    statistic,
    n_seeds: list[int],
    keys: list[str],
    n_resamples: int,
    seed: int,
    confidence: float = 0.95,
    paired: bool = False,
) -> dict[str, tuple[float, float]]:
    """Percentile intervals of statistic(*seed_indices)[key] when each sample's seeds are resampled
    independently (or, `paired`, with the same draws for every sample: equal sizes); {} when there
    is nothing to resample (a single seed or n_resamples = 0)."""
    if n_resamples <= 0 or min(n_seeds) < 2:
        return {}

    def stacked(*indices, axis=-1):
        one = indices[0].ndim == 1
        out = statistic(*[np.atleast_2d(i).astype(int) for i in indices])
        values = np.stack([out[k] for k in keys])  # (K, B)
        return values[:, 0] if one else values

    # a statistic that is NaN in some resamples (a level the baseline never defines) gives NaN
    # limits; scipy warns about that, the NaN in the table already says it
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", scipy.stats.DegenerateDataWarning)
        result = scipy.stats.bootstrap(
            tuple(np.arange(n) for n in n_seeds),
            stacked,
            paired=paired,
            vectorized=True,
            method="percentile",
            n_resamples=n_resamples,
            confidence_level=confidence,
            random_state=np.random.default_rng(seed),
        )
    low, high = result.confidence_interval
    return {k: (float(lo), float(hi)) for k, lo, hi in zip(keys, low, high)}


# --- one experiment's comparison table ----------------------------------------------------------


def baseline_still_rising(base: ArmCurves) -> bool:
    """True when the baseline's curve peaks at its last checkpoint."""
    after = base.times > 0
    return bool(np.nanargmax(base.curve()[after]) == after.sum() - 1)


def bounded(t_base: float, t_arm: float, t_arm_last: float, baseline_rising: bool = False) -> tuple[float, str]:
    """(value, bound) of t_base / t_arm as reported: see the module docstring on censoring."""
    if not np.isfinite(t_base):
        return np.nan, "n/a"
    if np.isinf(t_arm):
        return (np.nan, "n/a") if baseline_rising else (t_base / t_arm_last, "<")
    return (t_base / t_arm if t_arm > 0 else np.inf), (">=" if baseline_rising else "")


@dataclass
class _Comparison:
    """What every arm of one `compare_arms` call is compared with and how."""

    exp: Results
    base: Any  # the baseline's curves (arm_curves)
    baseline: str
    benchmark: str
    metric: str
    q: float
    gain_fractions: tuple
    n_bootstrap: int
    seed: int
    budget: float
    rising: bool
    gains: list[str]
    speedups: dict  # speedup column -> (baseline time, arm time, whether the baseline's censoring applies)


def compare_arms(
    exp: Results,
    baseline: str,
    benchmark: str,
    metric: str,
    q: float = 0.99,
    n_bootstrap: int = 9999,
    seed: int = 0,
    gain_fractions=GAIN_FRACTIONS,
    progress: bool = True,
    axis: str = "time_s",
) -> pd.DataFrame:
    """One row per arm (the baseline first): the paper's speedup with its bootstrap CI and
    censoring, the interpolated and gain-fraction speedups, peak accuracy and mean accuracy over the
    baseline's budget with CIs, seconds per step. On another `axis` (rollouts, tokens) every "time"
    is that quantity instead: the speedup is then the baseline's rollouts (tokens) to reach the
    threshold over the arm's, Pilot-Commit's headline statistic."""
    if not 0 < q <= 1:
        raise PodsBenchError(f"--q must be in (0, 1], got {q}")
    base = arm_curves(exp.evals, baseline, benchmark, metric, axis)
    if not (base.times > 0).any():
        raise PodsBenchError(f"{exp.name}: baseline {baseline!r} has no checkpoint after the start")
    gains = [f"gain{round(f * 100)}" for f in gain_fractions]
    speedups = {
        "speedup": ("t_base", "t_arm", True),
        "speedup_interp": ("t_base_interp", "t_arm_interp", True),
        **{f"speedup_{g}": (f"t_base_{g}", f"t_arm_{g}", False) for g in gains},
    }
    c = _Comparison(
        exp,
        base,
        baseline,
        benchmark,
        metric,
        q,
        gain_fractions,
        n_bootstrap,
        seed,
        budget=float(base.times[-1]),
        rising=baseline_still_rising(base),
        gains=gains,
        speedups=speedups,
    )
    totals = exp.step_times[exp.step_times["phase"] == "total"].groupby("arm")["seconds_per_step"]
    rows = []
    arms = [baseline] + [a for a in exp.arm_names if a != baseline]
    for name in tqdm(arms, desc=f"{exp.name}: bootstrap", unit="arm", disable=None if progress else True):
        arm = base if name == baseline else arm_curves(exp.evals, name, benchmark, metric, axis)
        row = _point_row(c, name, arm)
        row.update(_intervals(c, name, arm))
        seconds = totals.get_group(name) if name in totals.groups else pd.Series(dtype=float)
        row["seconds_per_step"] = float(seconds.mean()) if len(seconds) else np.nan
        row["seconds_per_step_sd"] = float(seconds.std()) if len(seconds) > 1 else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _point_row(c: _Comparison, name: str, arm) -> dict:
    """An arm's row of `compare_arms` from the mean curves of its seeds (no intervals yet)."""
    base, is_baseline = c.base, name == c.baseline
    point = {
        k: float(v[0])
        for k, v in pair_statistics(base, base.curve()[None], arm, arm.curve()[None], c.q, c.gain_fractions).items()
    }
    never = np.isinf(point["t_arm"])
    arm_info = c.exp.arms.set_index("arm")
    row = dict(
        experiment=c.exp.name,
        benchmark=c.benchmark,
        metric=c.metric,
        baseline=c.baseline,
        arm=name,
        is_baseline=is_baseline,
        n=int(arm_info.loc[name, "n"]),
        m=int(arm_info.loc[name, "m"]),
        rule=arm_info.loc[name, "rule"],
        n_seeds=arm.n_seeds,
        q=c.q,
        threshold=point["threshold"],
        budget_s=c.budget,
        t_baseline_s=point["t_base"],
        t_arm_s=point["t_arm"],
        t_arm_last_s=float(arm.times[-1]),
        t_baseline_interp_s=point["t_base_interp"],
        t_arm_interp_s=point["t_arm_interp"],
        censored="; ".join(
            text
            for flag, text in ((c.rising, "baseline peaks at its last checkpoint"), (never, "arm never reaches T"))
            if flag
        ),
    )
    for column, (t_base, t_arm, censorable) in c.speedups.items():
        row[column], row[f"{column}_bound"] = (
            (1.0, "") if is_baseline else bounded(point[t_base], point[t_arm], arm.times[-1], c.rising and censorable)
        )
    for g in c.gains:
        row[f"{g}_level"] = point[f"{g}_level"]
        row[f"t_baseline_{g}_s"], row[f"t_arm_{g}_s"] = point[f"t_base_{g}"], point[f"t_arm_{g}"]
    after = arm.times > 0
    row.update(
        peak=point["peak_arm"],
        peak_time_s=float(arm.times[after][np.nanargmax(arm.curve()[after])]),
        mean_over_budget=point["mean_arm"],
        mean_diff=point["mean_diff"],
    )
    return row


def paired_seeds(base: ArmCurves, arm: ArmCurves) -> bool:
    """Whether the arm's runs pair with the baseline's: the same seeds (more than one)."""
    return len(base.seeds) > 1 and tuple(base.seeds) == tuple(arm.seeds)


def _intervals(c: _Comparison, name: str, arm) -> dict:
    """Bootstrap intervals over seeds: the baseline's own statistics from its seeds alone, an arm's
    against the baseline."""
    base = c.base
    if name == c.baseline:
        ci = bootstrap_ci(
            lambda i: arm_statistics(base, base.curve(i), c.budget),
            [base.n_seeds],
            ["peak_arm", "mean_arm"],
            c.n_bootstrap,
            c.seed,
        )
    else:
        ci = bootstrap_ci(
            lambda ib, ia: pair_statistics(base, base.curve(ib), arm, arm.curve(ia), c.q, c.gain_fractions),
            [base.n_seeds, arm.n_seeds],
            [*c.speedups, "peak_arm", "mean_arm", "mean_diff"],
            c.n_bootstrap,
            c.seed,
            paired=paired_seeds(base, arm),
        )
    out = {"paired_seeds": name != c.baseline and paired_seeds(base, arm)}
    columns = [
        *[(k, k) for k in c.speedups],
        ("peak_arm", "peak"),
        ("mean_arm", "mean_over_budget"),
        ("mean_diff", "mean_diff"),
    ]
    for key, column in columns:
        out[f"{column}_ci_low"], out[f"{column}_ci_high"] = ci.get(key, (np.nan, np.nan))
    out["n_bootstrap"] = c.n_bootstrap if ci else 0
    return out
