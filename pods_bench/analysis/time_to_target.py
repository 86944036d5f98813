"""Time to a fixed target under MLPerf Training's rules: the strictest time-to-target convention, beside
the paper's time-to-peak and the gain-fraction statistics of speedup.py.

MLPerf Training (github.com/mlcommons/training_policies at d73e20f1, training_rules.adoc):
- the quality target is fixed before the timed runs, from reference runs (:27, :39); here
  `analysis.target`, which `pods-bench target` derives from baseline runs whose seeds are not
  among the timed ones (`knee_target` below);
- a run is timed from its start until the evaluation that first reaches the target, the evaluation
  time on the clock (:441, :487-491: "the clock may not be paused"). pods-bench pauses its training
  clock while it evaluates, so a run's time here is its training clock at that checkpoint plus the
  seconds of every evaluation up to and including it; the table states the evaluation's share;
- an arm's result drops the fastest and the slowest run and averages the rest (:509); a run that
  never reaches the target is a failure, counted as the slowest (so dropped); more than one failure
  makes the result invalid.

Beside it, the interquartile mean of the runs' times (the 25 % trimmed mean: robust to one slow or
lost run and usable with few runs, as rliable recommends for RL) with a percentile-bootstrap interval
over runs; a never-reaching run counts as an infinite time, so an interval can be open above.

How the target is chosen (MLPerf sets it where the reference has converged, "past the knee"): the
reference runs' mean curve, its knee found by the Kneedle rule (the `kneed` package; concave,
increasing), and the target the mean curve's value at the first checkpoint after the knee, lowered
to the lowest peak of the reference runs so that every reference run reaches it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.stats
from kneed import KneeLocator

from pods_bench.analysis.speedup import arm_curves
from pods_bench.analysis.tidy import Results
from pods_bench.errors import PodsBenchError

TRIM = 0.25  # the interquartile mean cuts a quarter at each end
MLPERF_COLUMNS = [
    "arm",
    "is_baseline",
    "target",
    "n_runs",
    "n_failed",
    "valid",
    "olympic_time_s",  # MLPerf's result: the mean after dropping the fastest and slowest run
    "olympic_train_s",  # the same runs' training clock alone
    "eval_share",  # evaluation seconds / time, over the runs the result averages
    "olympic_speedup",  # baseline's olympic time / the arm's
    "iqm_time_s",
    "iqm_ci_low_s",
    "iqm_ci_high_s",
    "iqm_speedup",
    "run_times_s",  # every run's time to the target, seed:seconds ("inf": never reached it)
]


@dataclass(frozen=True)
class Target:
    value: float
    knee_time_s: float  # the knee of the reference's mean curve on the training clock
    at_time_s: float  # the checkpoint whose mean value gives the target (before the cap)
    reference_seeds: tuple
    capped: bool  # lowered to the lowest peak among the reference runs


def knee_target(exp: Results, arm: str, benchmark: str, metric: str, seeds=None) -> Target:
    """The target fixed from the reference runs `seeds` of `arm` (default: all of them)."""
    ref = arm_curves(exp.evals, arm, benchmark, metric)
    rows = np.arange(ref.n_seeds) if seeds is None else [ref.seeds.index(s) for s in seeds if s in ref.seeds]
    if seeds is not None and len(rows) != len(set(seeds)):
        missing = sorted(set(seeds) - set(ref.seeds))
        raise PodsBenchError(f"arm {arm!r} has no runs with seeds {missing} (it has {list(ref.seeds)})")
    curve = ref.curve(np.asarray(rows))
    done = ~np.isnan(curve)
    times, curve = ref.times[done], curve[done]
    if len(times) < 3:
        raise PodsBenchError(f"arm {arm!r}: {len(times)} checkpoints; a knee needs at least 3")
    knee = KneeLocator(times, curve, curve="concave", direction="increasing").knee
    if knee is None:
        raise PodsBenchError(
            f"arm {arm!r}: its mean {benchmark} {metric} curve has no knee (still rising, or flat): "
            "train the reference runs longer before fixing a target"
        )
    k = min(int(np.searchsorted(times, knee)) + 1, len(times) - 1)  # the first checkpoint past the knee
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lowest_peak = float(np.nanmin(np.nanmax(ref.values[np.asarray(rows)][:, ref.times > 0], axis=1)))
    value = min(float(curve[k]), lowest_peak)
    return Target(value, float(knee), float(times[k]), tuple(ref.seeds[r] for r in rows), value < curve[k])


def run_times(exp: Results, arm: str, benchmark: str, metric: str, target: float) -> pd.DataFrame:
    """Per seed of `arm`: the training clock at its first checkpoint (after step 0) at or above
    `target`, the evaluation seconds spent up to and including it (every benchmark it evaluated),
    and their sum; inf where the run never reaches the target."""
    rows = exp.evals[exp.evals["arm"] == arm]
    out = []
    for seed, run in rows.groupby("seed"):
        # one row per evaluation (the table has a row per metric)
        evaluations = run.drop_duplicates(["step", "benchmark"]).groupby("step")["eval_time_s"].sum(min_count=1)
        eval_spent = evaluations.fillna(0.0).sort_index().cumsum()
        scores = run[(run["benchmark"] == benchmark) & (run["metric"] == metric)].sort_values("step")
        hit = scores[(scores["step"] > 0) & (scores["value"] >= target)]
        if hit.empty:
            out.append(dict(seed=seed, train_s=np.inf, eval_s=np.inf, time_s=np.inf))
            continue
        first = hit.iloc[0]
        spent = float(eval_spent.loc[first["step"]])
        out.append(dict(seed=seed, train_s=float(first["raw_time_s"]), eval_s=spent))
        out[-1]["time_s"] = out[-1]["train_s"] + spent
    return pd.DataFrame(out, columns=["seed", "train_s", "eval_s", "time_s"])


def olympic_mean(times: np.ndarray) -> tuple[float, np.ndarray]:
    """MLPerf's result of a set of run times (inf: the run missed the target): (the mean after dropping
    the fastest and the slowest run, the kept runs' indices); NaN (and none kept) when more than one
    run failed or there are fewer than 3 runs."""
    times = np.asarray(times, float)
    if len(times) < 3 or np.isinf(times).sum() > 1:
        return np.nan, np.array([], int)
    kept = np.argsort(times, kind="stable")[1:-1]
    return float(times[kept].mean()), kept


def interquartile_mean(times: np.ndarray, axis: int = -1) -> np.ndarray:
    """The 25 % trimmed mean (inf when a never-reaching run is among the kept middle half)."""
    with np.errstate(invalid="ignore"):
        return scipy.stats.trim_mean(times, TRIM, axis=axis)


def iqm_interval(times: np.ndarray, n_bootstrap: int, seed: int) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the interquartile mean over runs (NaN without resamples)."""
    times = np.asarray(times, float)
    if n_bootstrap == 0 or len(times) < 2:
        return np.nan, np.nan
    with warnings.catch_warnings():  # resamples with infinite times: their spread is not finite
        warnings.simplefilter("ignore", RuntimeWarning)
        res = scipy.stats.bootstrap(
            (times,),
            interquartile_mean,
            vectorized=True,
            n_resamples=n_bootstrap,
            method="percentile",
            random_state=np.random.default_rng(seed),
        )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _speedup(t_base: float, t_arm: float) -> float:
    """t_base / t_arm; 0 when the arm never gets there, NaN when the baseline's time is undefined."""
    if not np.isfinite(t_base):
        return np.nan
    return 0.0 if np.isinf(t_arm) else t_base / t_arm


def mlperf_table(
    exp: Results, baseline: str, benchmark: str, metric: str, target: float, n_bootstrap: int = 9999, seed: int = 0
) -> pd.DataFrame:
    """One row per arm: the MLPerf result and the interquartile mean, both to `target` (MLPERF_COLUMNS)."""
    rows = []
    for arm in exp.arm_names:
        runs = run_times(exp, arm, benchmark, metric, target)
        times = runs["time_s"].to_numpy()
        olympic, kept = olympic_mean(times)
        train = runs["train_s"].to_numpy()[kept].mean() if len(kept) else np.nan
        low, high = iqm_interval(times, n_bootstrap, seed)
        rows.append(
            dict(
                arm=arm,
                is_baseline=arm == baseline,
                target=target,
                n_runs=len(runs),
                n_failed=int(np.isinf(times).sum()),
                valid=bool(np.isfinite(olympic)),
                olympic_time_s=olympic,
                olympic_train_s=train,
                eval_share=1 - train / olympic if np.isfinite(olympic) else np.nan,
                iqm_time_s=float(interquartile_mean(times)) if len(times) else np.nan,
                iqm_ci_low_s=low,
                iqm_ci_high_s=high,
                run_times_s=" ".join(f"{s}:{t:.1f}" for s, t in zip(runs["seed"], times)),
            )
        )
    table = pd.DataFrame(rows, columns=MLPERF_COLUMNS)
    base = table.set_index("arm").loc[baseline]
    table["olympic_speedup"] = [_speedup(base["olympic_time_s"], t) for t in table["olympic_time_s"]]
    table["iqm_speedup"] = [_speedup(base["iqm_time_s"], t) for t in table["iqm_time_s"]]
    return table
