"""The time-to-peak statistic, its companions and the bootstrap, on hand-made curves."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import sys
import termios
import warnings

import numpy as np
import pandas as pd
import pytest

from pods_bench.analysis.speedup import (
    ArmCurves,
    arm_curves,
    bootstrap_ci,
    bounded,
    compare_arms,
    first_crossing,
    mean_over_budget,
    pair_statistics,
    ratio,
)
from pods_bench.analysis.tidy import EVAL_COLUMNS, STEP_TIME_COLUMNS, Results, arm_table
from pods_bench.errors import PodsBenchError

TIMES = np.array([0.0, 10.0, 20.0, 30.0, 40.0])


def make_experiment(arms: dict[str, list[list[float]]], times=TIMES) -> Results:
    """Arms {name: one curve per seed} -> a Results; the first arm is GRPO-like (n == m). `times` is
    one grid for every arm or {arm: its grid}; each checkpoint's rollouts are 16 per second."""
    rows, arm_rows, step_rows = [], [], []
    grids = times if isinstance(times, dict) else dict.fromkeys(arms, times)
    for i, (arm, seeds) in enumerate(arms.items()):
        arm_rows.append(dict(arm=arm, n=8 if i == 0 else 32, m=8, rule="all" if i == 0 else "max_variance"))
        for seed, curve in enumerate(seeds):
            step_rows.append(dict(experiment="x", arm=arm, seed=seed, phase="total", seconds_per_step=1.0 + i))
            for t, v in zip(grids[arm], curve):
                rows.append(
                    dict(
                        experiment="x",
                        arm=arm,
                        seed=seed,
                        time_s=t,
                        raw_time_s=t,
                        step=int(t),
                        benchmark="arith",
                        metric="answer_acc",
                        value=v,
                        n_repeats=1,
                        n_problems=200,
                        rollouts=16 * t,
                    )
                )
    return Results(
        name="x",
        evals=pd.DataFrame(rows, columns=EVAL_COLUMNS),
        step_times=pd.DataFrame(step_rows, columns=STEP_TIME_COLUMNS),
        arms=arm_table(arm_rows),
        hardware="test CPU",
        source="runs",
        default_benchmark="arith",
        default_baseline=next(iter(arms)),
    )


def compare(arms, q=0.99, n_bootstrap=0, seed=0, **kw) -> pd.DataFrame:
    exp = make_experiment(arms, **kw)
    return compare_arms(
        exp, exp.default_baseline, "arith", "answer_acc", q=q, n_bootstrap=n_bootstrap, seed=seed, progress=False
    ).set_index("arm")


BASE = [0.5, 0.6, 0.8, 0.9, 0.9]


def test_first_grid_time_at_or_above_threshold():
    s = compare({"grpo": [BASE], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]]})
    # T = 0.99 * 0.9 = 0.891: GRPO first at 30 s, PODS at 20 s
    assert s.loc["pods", "threshold"] == pytest.approx(0.891)
    assert (s.loc["pods", "t_baseline_s"], s.loc["pods", "t_arm_s"]) == (30.0, 20.0)
    assert s.loc["pods", "speedup"] == pytest.approx(1.5)
    assert s.loc["pods", "speedup_bound"] == "" and s.loc["pods", "censored"] == ""
    assert s.loc["grpo", "speedup"] == 1.0 and s.loc["grpo", "is_baseline"]


def test_ties_reaching_exactly_the_threshold_counts():
    # q = 1: T is the baseline's peak itself; an arm touching it exactly has reached it
    s = compare({"grpo": [BASE], "pods": [[0.5, 0.7, 0.9, 0.8, 0.8]], "same": [BASE]}, q=1.0)
    assert s.loc["pods", "t_arm_s"] == 20.0
    assert s.loc["pods", "speedup"] == pytest.approx(1.5)
    assert s.loc["same", "speedup"] == pytest.approx(1.0)  # identical curves tie at 1.0x


def test_start_point_is_never_the_crossing():
    # an arm at T already at time 0 is credited at its first checkpoint after the start, as in the paper
    s = compare({"grpo": [BASE], "pods": [[0.95, 0.95, 0.95, 0.95, 0.95]]})
    assert s.loc["pods", "t_arm_s"] == 10.0 and s.loc["pods", "speedup"] == pytest.approx(3.0)


def test_never_reached_is_an_upper_bound():
    s = compare({"grpo": [BASE], "pods": [[0.5, 0.6, 0.7, 0.8, 0.85]]})
    row = s.loc["pods"]
    assert np.isinf(row["t_arm_s"])
    assert row["speedup_bound"] == "<" and row["speedup"] == pytest.approx(30.0 / 40.0)
    assert row["censored"] == "arm never reaches T"


def test_baseline_peaking_at_its_last_checkpoint_is_a_lower_bound():
    s = compare({"grpo": [[0.5, 0.6, 0.7, 0.8, 0.9]], "pods": [[0.5, 0.9, 0.9, 0.9, 0.9]]})
    row = s.loc["pods"]
    assert row["censored"] == "baseline peaks at its last checkpoint"
    assert row["speedup_bound"] == ">=" and row["speedup"] == pytest.approx(4.0)
    # the interpolated speedup shares the censoring (39.1 s / 9.775 s); a gain fraction's level is below
    # the baseline's peak, so the baseline's time to it is not censored (20 s / 5 s)
    assert row["speedup_interp_bound"] == ">=" and row["speedup_interp"] == pytest.approx(4.0)
    assert row["speedup_gain50_bound"] == "" and row["speedup_gain50"] == pytest.approx(4.0)
    assert s.loc["grpo", "speedup_bound"] == "" and s.loc["grpo", "speedup"] == 1.0  # the baseline is 1.0x
    both = compare({"grpo": [[0.5, 0.6, 0.7, 0.8, 0.9]], "pods": [[0.5, 0.6, 0.6, 0.6, 0.6]]}).loc["pods"]
    assert both["speedup_bound"] == "n/a" and np.isnan(both["speedup"])


def test_interpolated_crossing_and_gain_fractions():
    s = compare({"grpo": [BASE], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]]}).loc["pods"]
    # T = 0.891: GRPO between (20, 0.8) and (30, 0.9) at 20 + 0.91 * 10; PODS between (10, 0.8), (20, 0.9)
    assert s["t_baseline_interp_s"] == pytest.approx(29.1)
    assert s["t_arm_interp_s"] == pytest.approx(19.1)
    # gain 0.5 -> 0.9: 50 % level 0.7 reached by GRPO at 15 s, by PODS at 0 + 0.2/0.3 * 10 s
    assert s["gain50_level"] == pytest.approx(0.7)
    assert s["t_baseline_gain50_s"] == pytest.approx(15.0)
    assert s["t_arm_gain50_s"] == pytest.approx(20 / 3)
    assert s["speedup_gain50"] == pytest.approx(15.0 / (20 / 3))


def test_no_gain_leaves_gain_fractions_undefined():
    s = compare({"grpo": [[0.5, 0.4, 0.45, 0.4, 0.4]], "pods": [[0.5, 0.5, 0.5, 0.5, 0.5]]}).loc["pods"]
    assert np.isnan(s["speedup_gain80"]) and s["speedup_gain80_bound"] == "n/a"


def test_mean_over_budget_is_the_trapezoid_area_over_the_budget():
    curves = np.array([[0.0, 1.0, 1.0, 1.0, 1.0]])
    assert mean_over_budget(TIMES, curves, 40.0)[0] == pytest.approx((5 + 30) / 40)
    assert mean_over_budget(TIMES, curves, 15.0)[0] == pytest.approx((5 + 5) / 15)  # interpolated end
    assert np.isnan(mean_over_budget(TIMES, curves, 50.0)[0])  # curve stops before the budget
    # a budget a rounding error past the last grid time is that time, not an index past the grid
    assert mean_over_budget(TIMES, curves, 40.0 + 5e-10)[0] == pytest.approx((5 + 30) / 40)
    s = compare({"grpo": [BASE], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]]}).loc["pods"]
    assert s["mean_over_budget"] == pytest.approx((6.5 + 8.5 + 9 + 9) / 40)


def test_first_crossing_ignores_missing_checkpoints():
    curves = np.array([[0.1, np.nan, 0.9, 0.9, 0.9], [0.1, 0.2, 0.3, 0.4, 0.5]])
    t = first_crossing(TIMES, curves, np.array([0.8, 0.8]))
    assert t[0] == 20.0 and np.isinf(t[1])


SEEDS = {
    "grpo": [
        [0.5, 0.6, 0.8, 0.9, 0.88],
        [0.5, 0.62, 0.78, 0.87, 0.9],
        [0.5, 0.58, 0.82, 0.88, 0.89],
        [0.5, 0.65, 0.75, 0.86, 0.91],
    ],
    "pods": [[0.5, 0.8, 0.9, 0.9, 0.9], [0.5, 0.75, 0.88, 0.91, 0.9], [0.5, 0.85, 0.87, 0.9, 0.92]],
}


def test_bootstrap_is_seeded_and_contains_the_point_estimate():
    a = compare(SEEDS, n_bootstrap=500, seed=3).loc["pods"]
    b = compare(SEEDS, n_bootstrap=500, seed=3).loc["pods"]
    for column in ("speedup", "speedup_interp", "speedup_gain80", "peak", "mean_over_budget", "mean_diff"):
        assert (a[f"{column}_ci_low"], a[f"{column}_ci_high"]) == (b[f"{column}_ci_low"], b[f"{column}_ci_high"])
        assert a[f"{column}_ci_low"] <= a[column] <= a[f"{column}_ci_high"], column
    assert a["speedup_ci_low"] < a["speedup_ci_high"]  # seeds differ, so resamples do too
    assert a["n_bootstrap"] == 500
    other = compare(SEEDS, n_bootstrap=500, seed=4).loc["pods"]
    assert (other["speedup_interp_ci_low"], other["speedup_interp_ci_high"]) != (
        a["speedup_interp_ci_low"],
        a["speedup_interp_ci_high"],
    )


def test_bootstrap_recomputes_the_threshold_in_every_resample():
    # resampling seeds moves the baseline's peak and thereby T: a statistic of T alone has spread
    base = ArmCurves("grpo", TIMES, np.array(SEEDS["grpo"]))
    ci = bootstrap_ci(lambda i: {"T": 0.99 * np.nanmax(base.curve(i)[:, 1:], axis=1)}, [4], ["T"], 400, seed=0)
    low, high = ci["T"]
    assert low < 0.99 * base.curve()[1:].max() < high


def test_a_seed_missing_a_checkpoint_in_the_resamples():
    """Seed 1 of GRPO has no 20 s checkpoint: a resample of seed 1 alone has no value there (its
    mean accuracy over the budget is undefined, so its interval is NaN), its peak is still 0.9."""
    exp = make_experiment({"grpo": [BASE, BASE], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]] * 2})
    exp.evals = exp.evals[~((exp.evals["arm"] == "grpo") & (exp.evals["seed"] == 1) & (exp.evals["time_s"] == 20.0))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = compare_arms(exp, "grpo", "arith", "answer_acc", n_bootstrap=50, progress=False).set_index("arm")
    assert [str(w.message) for w in caught] == []
    base = row.loc["grpo"]
    assert (base["peak_ci_low"], base["peak_ci_high"]) == pytest.approx((0.9, 0.9))
    assert np.isnan(base["mean_over_budget_ci_low"]) and np.isnan(base["mean_over_budget_ci_high"])
    assert base["mean_over_budget"] == pytest.approx((5.5 + 7 + 8.5 + 9) / 40)  # the mean curve is whole


def test_single_seed_has_no_interval():
    s = compare({"grpo": [BASE], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]]}, n_bootstrap=500).loc["pods"]
    assert np.isnan(s["speedup_ci_low"]) and np.isnan(s["peak_ci_high"])
    assert s["n_bootstrap"] == 0 and s["speedup"] == pytest.approx(1.5)
    assert not s["paired_seeds"]  # one seed, the same label in both arms: nothing to pair


def test_mean_accuracy_uses_the_common_window_when_arms_end_a_step_apart():
    """Own runs stop once the clock passes the budget, so the arm's last checkpoint may come a
    fraction of a step before the baseline's; the mean over the budget must still be defined."""
    base = ArmCurves("grpo", np.array([0.0, 30.0, 60.8]), np.array([[0.3, 0.6, 0.7]]))
    arm = ArmCurves("pods", np.array([0.0, 30.0, 60.5]), np.array([[0.3, 0.65, 0.7]]))
    s = pair_statistics(base, base.curve()[None], arm, arm.curve()[None], q=0.99)
    assert np.isfinite(s["mean_arm"]).all() and np.isfinite(s["mean_base"]).all()
    assert s["mean_diff"][0] > 0
    short = ArmCurves("pods", np.array([0.0, 30.0]), np.array([[0.3, 0.65]]))  # stopped halfway
    assert np.isnan(pair_statistics(base, base.curve()[None], short, short.curve()[None], q=0.99)["mean_arm"]).all()


def test_arms_with_the_baselines_seeds_are_resampled_in_pairs():
    """Seed k of both arms shares what seed k's machine and data did (here: a level offset per seed);
    resampled in pairs, the offsets cancel and the difference is exact in every resample. The same
    runs under other seed labels (no pairs) give the wide interval the offsets make: the control."""
    offsets = [0.0, 0.1, -0.1, 0.05]
    base = [[v + d for v in BASE] for d in offsets]
    arms = {"grpo": base, "pods": [[v + 0.02 for v in curve] for curve in base]}
    exp = make_experiment(arms)
    kw = dict(n_bootstrap=500, seed=0, progress=False)
    paired = compare_arms(exp, "grpo", "arith", "answer_acc", **kw).set_index("arm").loc["pods"]
    assert paired["paired_seeds"]
    assert paired["mean_diff_ci_low"] == pytest.approx(0.02) == paired["mean_diff_ci_high"]

    relabelled = exp.evals.copy()
    relabelled.loc[relabelled["arm"] == "pods", "seed"] += 10
    exp.evals = relabelled
    unpaired = compare_arms(exp, "grpo", "arith", "answer_acc", **kw).set_index("arm").loc["pods"]
    assert not unpaired["paired_seeds"]
    assert unpaired["mean_diff"] == pytest.approx(0.02)
    assert unpaired["mean_diff_ci_high"] - unpaired["mean_diff_ci_low"] > 0.05


def test_the_bootstrap_interval_is_the_95_percent_percentile_interval():
    """Against an independent resampling of the same data (other draws): the mean of ten seeds
    0..9 has a 95 % percentile interval about [2.7, 6.3] (an 80 % one would be about [3.3, 5.7])."""
    values = np.arange(10.0)
    ci = bootstrap_ci(lambda i: {"mean": values[i].mean(axis=-1)}, [10], ["mean"], 20_000, seed=0)
    draws = np.random.default_rng(1).choice(values, size=(20_000, 10)).mean(axis=1)
    low, high = np.percentile(draws, [2.5, 97.5])
    assert ci["mean"] == pytest.approx((low, high), abs=0.15)


def test_resamples_in_which_the_arm_never_reaches_t_count_as_speedup_zero():
    # seed 2 of PODS never reaches T = 0.891; a resample of only that seed (1 in 27) has no crossing,
    # which is a speedup of 0 (not undefined), so the interval's lower limit is 0
    base = [BASE, BASE, BASE]
    pods = [[0.5, 0.9, 0.9, 0.9, 0.9], [0.5, 0.9, 0.9, 0.9, 0.9], [0.5, 0.6, 0.6, 0.6, 0.6]]
    row = compare({"grpo": base, "pods": pods}, n_bootstrap=4000).loc["pods"]
    assert row["speedup_ci_low"] == 0.0
    assert row["speedup_ci_high"] == pytest.approx(3.0)  # GRPO at 30 s, PODS at 10 s


# --- independent recomputations on the same draws -----------------------------------------------
# scipy.stats.bootstrap draws, for each sample in turn, rng.integers(0, n, (n_resamples, n)) from the
# generator it is given (one draw of seed indices when paired); the percentile interval is then the
# linear-interpolation percentile of the resampled statistic. These tests redo that by hand.


def same_draws(seed: int, n_resamples: int, *sizes: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, (n_resamples, n)) for n in sizes]


def percentile_interval(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    alpha = (1 - confidence) / 2
    return tuple(np.percentile(values, [100 * alpha, 100 * (1 - alpha)]))


def test_bootstrap_interval_is_the_percentile_interval_of_the_same_draws():
    """Exactly the 2.5 and 97.5 percentiles of the resampled means (not 10/90 for a 0.80 level, not
    BCa), and the 5/95 ones when 90 % is asked for."""
    values = np.array([0.0, 1.0, 3.0, 7.0, 8.0, 20.0])
    mean = lambda i: {"mean": values[i].mean(axis=-1)}  # noqa: E731
    (draws,) = same_draws(5, 3000, 6)
    by_hand = values[draws].mean(axis=1)
    assert bootstrap_ci(mean, [6], ["mean"], 3000, seed=5)["mean"] == pytest.approx(percentile_interval(by_hand))
    ci90 = bootstrap_ci(mean, [6], ["mean"], 3000, seed=5, confidence=0.9)["mean"]
    assert ci90 == pytest.approx(percentile_interval(by_hand, 0.9))
    assert ci90 != pytest.approx(percentile_interval(by_hand))  # the level matters on these draws


@pytest.mark.filterwarnings("ignore:Degrees of freedom")  # scipy's standard error of a single resample
def test_bootstrap_edge_sizes():
    values = np.array([1.0, 3.0, 4.0])
    mean = lambda i: {"mean": values[i].mean(axis=-1)}  # noqa: E731
    # one resample: both limits are that resample's mean
    (draw,) = same_draws(2, 1, 3)
    assert bootstrap_ci(mean, [3], ["mean"], 1, seed=2)["mean"] == pytest.approx((values[draw].mean(),) * 2)
    # no resamples, or a sample of one seed: nothing to resample
    assert bootstrap_ci(mean, [3], ["mean"], 0, seed=2) == {}
    assert bootstrap_ci(mean, [1], ["mean"], 100, seed=2) == {}
    # two seeds are enough: the resampled means are 1, 2 or 3
    two = np.array([1.0, 3.0])
    (draws,) = same_draws(0, 400, 2)
    ci = bootstrap_ci(lambda i: {"m": two[i].mean(axis=-1)}, [2], ["m"], 400, seed=0)["m"]
    assert ci == pytest.approx(percentile_interval(two[draws].mean(axis=1)))


def test_infinite_and_undefined_resamples_give_limits_without_warnings():
    """A speedup is inf in a resample where the arm crosses at its start, NaN where the level is
    undefined: the limits say so (scipy's degenerate-data and inf - inf warnings are not repeated)."""
    values = np.array([1.0, np.inf])
    stat = lambda i: {"inf": values[i].mean(axis=-1), "nan": np.full(i.shape[0], np.nan)}  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ci = bootstrap_ci(stat, [2], ["inf", "nan"], 400, seed=0)
    assert [str(w.message) for w in caught] == []
    # a quarter of the resamples draw the finite seed twice (mean 1), the rest include inf
    assert ci["inf"] == (1.0, np.inf)
    assert np.isnan(ci["nan"]).all()


def test_two_samples_are_resampled_independently_unless_paired():
    """Unpaired: a draw for the first sample, then one for the second; paired: one draw for both."""
    a, b = np.array([0.0, 1.0, 2.0, 3.0, 9.0]), np.array([5.0, 1.0, 0.0, 4.0, 2.0])
    diff = lambda ia, ib: {"d": b[ib].mean(axis=-1) - a[ia].mean(axis=-1)}  # noqa: E731
    ia, ib = same_draws(7, 2000, 5, 5)
    unpaired = bootstrap_ci(diff, [5, 5], ["d"], 2000, seed=7)["d"]
    assert unpaired == pytest.approx(percentile_interval(b[ib].mean(axis=1) - a[ia].mean(axis=1)))
    (i,) = same_draws(7, 2000, 5)
    paired = bootstrap_ci(diff, [5, 5], ["d"], 2000, seed=7, paired=True)["d"]
    assert paired == pytest.approx(percentile_interval(b[i].mean(axis=1) - a[i].mean(axis=1)))


def test_default_bootstrap_is_9999_resamples_from_seed_0():
    """compare_arms's defaults against a recomputation: the baseline's peak and mean accuracy from its
    own seeds' draws, the arm's (other seed labels, so unpaired) mean difference from a draw of the
    baseline's seeds then one of the arm's."""
    exp = make_experiment(SEEDS)
    s = compare_arms(exp, "grpo", "arith", "answer_acc", progress=False).set_index("arm")
    base, pods = np.array(SEEDS["grpo"]), np.array(SEEDS["pods"])

    def mean_over_40s(curves):  # trapezoids of 10 s over the grid, divided by the 40 s budget
        return ((curves[:, :-1] + curves[:, 1:]) / 2 * 10).sum(axis=1) / 40

    (ib,) = same_draws(0, 9999, 4)
    curves = base[ib].mean(axis=1)
    row = s.loc["grpo"]
    assert row["n_bootstrap"] == 9999 and not row["paired_seeds"]
    assert (row["peak_ci_low"], row["peak_ci_high"]) == pytest.approx(percentile_interval(curves[:, 1:].max(axis=1)))
    ci = (row["mean_over_budget_ci_low"], row["mean_over_budget_ci_high"])
    assert ci == pytest.approx(percentile_interval(mean_over_40s(curves)))
    assert np.isnan(row["speedup_ci_low"])  # the baseline has no speedup interval

    ib, ia = same_draws(0, 9999, 4, 3)
    diff = mean_over_40s(pods[ia].mean(axis=1)) - mean_over_40s(base[ib].mean(axis=1))
    row = s.loc["pods"]
    assert (row["mean_diff_ci_low"], row["mean_diff_ci_high"]) == pytest.approx(percentile_interval(diff))


def test_the_baselines_own_interval_uses_the_comparisons_seed():
    """Eight baseline seeds with distinct peaks, so that the interval depends on the draws: the
    baseline's peak interval is the one of the draws of generator `seed`, and another seed moves it."""
    rng = np.random.default_rng(11)
    base = [[0.5, *(0.6 + 0.3 * rng.random(4))] for _ in range(8)]
    exp = make_experiment({"grpo": base, "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]] * 2})
    rows = {
        seed: compare_arms(exp, "grpo", "arith", "answer_acc", n_bootstrap=500, seed=seed, progress=False)
        .set_index("arm")
        .loc["grpo"]
        for seed in (3, 4)
    }
    intervals = {seed: (row["peak_ci_low"], row["peak_ci_high"]) for seed, row in rows.items()}
    (draws,) = same_draws(3, 500, 8)
    peaks = np.array(base)[draws].mean(axis=1)[:, 1:].max(axis=1)
    assert intervals[3] == pytest.approx(percentile_interval(peaks))
    assert intervals[4] != pytest.approx(intervals[3])


def test_never_reaching_resamples_give_the_lower_limit_zero_on_the_same_draws():
    """The seed set of the never-reaching test, the speedup interval recomputed resample by resample:
    T from the baseline (always 0.891, reached at 30 s), the arm's first grid time at or above it,
    30 / t, and 0 where the resampled arm never gets there (seed 2 drawn three times)."""
    base = [BASE, BASE, BASE]
    pods = [[0.5, 0.9, 0.9, 0.9, 0.9], [0.5, 0.9, 0.9, 0.9, 0.9], [0.5, 0.6, 0.6, 0.6, 0.6]]
    row = compare({"grpo": base, "pods": pods}, n_bootstrap=4000).loc["pods"]
    assert row["paired_seeds"]
    (draws,) = same_draws(0, 4000, 3)  # paired: one draw for both arms
    speedups = []
    for d in draws:
        curve = np.array(pods)[d].mean(axis=0)
        reached = [t for t, v in zip(TIMES, curve) if t > 0 and v >= 0.99 * 0.9]
        speedups.append(30.0 / reached[0] if reached else 0.0)
    assert 0.0 in speedups
    assert (row["speedup_ci_low"], row["speedup_ci_high"]) == pytest.approx(percentile_interval(np.array(speedups)))
    assert row["speedup_ci_low"] == 0.0


# --- one row of the table, value by value -------------------------------------------------------


def test_row_names_the_experiment_the_arm_its_settings_and_step_times():
    """A rising baseline and an arm that never reaches T on a longer grid: both censoring notes, the
    arm's own last checkpoint, and seconds per step from the "total" phase alone."""
    times = {"grpo": TIMES, "pods": np.array([0.0, 10.0, 20.0, 30.0, 50.0]), "rand": TIMES}
    arms = {"grpo": [[0.5, 0.6, 0.7, 0.8, 0.9]], "pods": [[0.5, 0.6, 0.7, 0.65, 0.6]], "rand": [BASE]}
    exp = make_experiment(arms, times=times)
    steps = [("grpo", "total", 1.0), ("grpo", "total", 3.0), ("grpo", "generation", 100.0), ("pods", "total", 5.0)]
    exp.step_times = pd.DataFrame(
        [dict(experiment="x", arm=a, seed=0, phase=p, seconds_per_step=v) for a, p, v in steps],
        columns=STEP_TIME_COLUMNS,
    )
    s = compare_arms(exp, "grpo", "arith", "answer_acc", n_bootstrap=0, progress=False).set_index("arm")
    pods, grpo = s.loc["pods"], s.loc["grpo"]
    for row in (pods, grpo):
        assert (row["experiment"], row["benchmark"], row["metric"], row["baseline"]) == (
            "x",
            "arith",
            "answer_acc",
            "grpo",
        )
        assert (row["n_seeds"], row["q"], row["budget_s"]) == (1, 0.99, 40.0)
    assert (pods["n"], pods["m"], pods["rule"]) == (32, 8, "max_variance")
    assert (grpo["n"], grpo["m"], grpo["rule"]) == (8, 8, "all")
    assert pods["censored"] == "baseline peaks at its last checkpoint; arm never reaches T"
    assert grpo["censored"] == "baseline peaks at its last checkpoint"
    assert (grpo["speedup"], grpo["speedup_bound"]) == (1.0, "")  # the baseline is 1.0x, never ">="
    assert (pods["speedup_bound"], pods["t_arm_last_s"], pods["t_baseline_s"]) == ("n/a", 50.0, 40.0)
    assert (pods["peak"], pods["peak_time_s"]) == (0.7, 20.0)
    # the baseline's mean accuracy over its own 40 s: trapezoids 5.5 + 6.5 + 7.5 + 8.5 over 40
    assert grpo["mean_over_budget"] == pytest.approx(28.0 / 40)
    # step times: GRPO 1 s and 3 s (mean 2, sd sqrt 2; the 100 s generation phase is not a step),
    # PODS a single 5 s (no sd), the third arm none
    assert (grpo["seconds_per_step"], grpo["seconds_per_step_sd"]) == pytest.approx((2.0, np.sqrt(2.0)))
    assert pods["seconds_per_step"] == 5.0 and np.isnan(pods["seconds_per_step_sd"])
    assert np.isnan(s.loc["rand", "seconds_per_step"]) and np.isnan(s.loc["rand", "seconds_per_step_sd"])


def test_another_axis_reads_every_arm_on_it():
    # rollouts are 16 per second here: the same crossings as in the first test, in rollouts
    exp = make_experiment({"grpo": [BASE], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]]})
    s = compare_arms(exp, "grpo", "arith", "answer_acc", n_bootstrap=0, progress=False, axis="rollouts")
    row = s.set_index("arm").loc["pods"]
    assert (row["t_baseline_s"], row["t_arm_s"], row["budget_s"]) == (480.0, 320.0, 640.0)
    assert row["speedup"] == pytest.approx(1.5)


def test_arm_curves_reads_one_arm_on_the_clock_by_default():
    exp = make_experiment({"grpo": [BASE, [0.4, 0.5, 0.6, 0.7, 0.8]], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]]})
    curves = arm_curves(exp.evals, "grpo", "arith", "answer_acc")
    assert curves.arm == "grpo" and curves.seeds == (0, 1)
    np.testing.assert_array_equal(curves.times, TIMES)
    np.testing.assert_array_equal(curves.values, [BASE, [0.4, 0.5, 0.6, 0.7, 0.8]])
    steps = arm_curves(exp.evals, "grpo", "arith", "answer_acc", axis="step")  # an integer column
    assert steps.times.dtype == np.float64 and steps.times.tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]


def test_what_cannot_be_compared_is_refused_with_its_reason():
    exp = make_experiment({"grpo": [BASE], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]]})
    with pytest.raises(PodsBenchError, match="^arm 'nope' has no arith answer_acc evaluations$"):
        arm_curves(exp.evals, "nope", "arith", "answer_acc")
    for q in (0.0, 1.5):
        with pytest.raises(PodsBenchError, match=re.escape(f"--q must be in (0, 1], got {q}")):
            compare_arms(exp, "grpo", "arith", "answer_acc", q=q, n_bootstrap=0, progress=False)
    missing = exp.evals.copy()
    missing.loc[missing["arm"] == "grpo", "time_s"] = np.nan
    message = "arm 'grpo' has checkpoints without time_s (a run whose train_log.jsonl is missing)"
    with pytest.raises(PodsBenchError, match=f"^{re.escape(message)}$"):
        arm_curves(missing, "grpo", "arith", "answer_acc")
    start_only = make_experiment({"grpo": [[0.5]], "pods": [[0.5, 0.8]]}, times={"grpo": [0.0], "pods": [0.0, 10.0]})
    with pytest.raises(PodsBenchError, match="^x: baseline 'grpo' has no checkpoint after the start$"):
        compare_arms(start_only, "grpo", "arith", "answer_acc", n_bootstrap=0, progress=False)


def test_a_first_checkpoint_at_one_counts_as_after_the_start():
    """Grid 0, 1, 2, 3, 4 (rollouts in thousands, say): t = 1 is a checkpoint like any other. GRPO
    peaks at t = 1 (0.9, not at its last checkpoint); PODS reaches T = 0.891 there too."""
    grid = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    grpo, pods = [0.5, 0.9, 0.6, 0.7, 0.8], [0.5, 0.95, 0.9, 0.9, 0.9]
    s = compare({"grpo": [grpo, grpo], "pods": [pods, pods]}, n_bootstrap=20, times=grid)
    base, row = s.loc["grpo"], s.loc["pods"]
    assert (base["peak"], base["peak_time_s"], base["censored"]) == (0.9, 1.0, "")
    assert (base["peak_ci_low"], base["peak_ci_high"]) == (0.9, 0.9)  # two identical seeds
    assert row["threshold"] == pytest.approx(0.891)
    assert (row["t_baseline_s"], row["t_arm_s"], row["speedup"], row["speedup_bound"]) == (1.0, 1.0, 1.0, "")
    assert (row["peak"], row["peak_time_s"]) == (0.95, 1.0)
    assert row["paired_seeds"]  # two seeds with the same labels
    # interpolated from the start: GRPO 0.391 / 0.4, PODS 0.391 / 0.45
    assert row["speedup_interp"] == pytest.approx((0.391 / 0.4) / (0.391 / 0.45))
    # a baseline with nothing but t = 1 after the start can still be compared
    short = compare({"grpo": [[0.5, 0.9]], "pods": [[0.5, 0.95]]}, times=np.array([0.0, 1.0])).loc["pods"]
    assert (short["t_baseline_s"], short["speedup"]) == (1.0, 1.0)


def test_the_start_is_never_the_peak():
    """Both arms start above everything they reach later (a start checkpoint from another task, say):
    the peak, its time, T and the censoring read only the checkpoints after the start."""
    grpo, pods = [0.95, 0.5, 0.6, 0.7, 0.8], [0.95, 0.6, 0.8, 0.8, 0.8]
    s = compare({"grpo": [grpo, grpo], "pods": [pods, pods]}, n_bootstrap=20)
    base, row = s.loc["grpo"], s.loc["pods"]
    assert (base["peak"], base["peak_time_s"]) == (0.8, 40.0)
    assert (base["peak_ci_low"], base["peak_ci_high"]) == (0.8, 0.8)
    assert base["censored"] == "baseline peaks at its last checkpoint"
    assert row["threshold"] == pytest.approx(0.792)  # 0.99 * 0.8: GRPO at 40 s, PODS at 20 s
    assert (row["t_baseline_s"], row["t_arm_s"], row["speedup_bound"]) == (40.0, 20.0, ">=")
    assert row["speedup"] == pytest.approx(2.0)
    assert (row["peak"], row["peak_time_s"]) == (0.8, 20.0)


def test_an_arm_above_the_level_at_its_start():
    """Interpolation never leaves the segment: an arm already above T at the start and still rising
    crosses at t = 0 (interpolated speedup inf); a flat one is credited at its first checkpoint. No
    warnings on the way (divisions by a zero rise are caught)."""
    arms = {"grpo": [BASE], "rising": [[0.95, 0.97, 0.97, 0.97, 0.97]], "flat": [[0.95] * 5]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = compare(arms)
    assert [str(w.message) for w in caught] == []
    rising, flat = s.loc["rising"], s.loc["flat"]
    assert (rising["t_arm_s"], rising["t_arm_interp_s"]) == (10.0, 0.0)
    assert (rising["speedup_interp"], rising["speedup_interp_bound"]) == (np.inf, "")
    assert rising["speedup"] == pytest.approx(3.0)
    assert (flat["t_arm_s"], flat["t_arm_interp_s"]) == (10.0, 10.0)
    assert flat["speedup_interp"] == pytest.approx(2.91)  # GRPO at 29.1 s


def test_a_baseline_without_gain_defines_no_gain_level():
    # flat at 0.5: no gain over the start, so no fraction of it (not a level equal to the start)
    s = compare({"grpo": [[0.5] * 5], "pods": [BASE]}).loc["pods"]
    assert np.isnan(s["gain50_level"]) and np.isnan(s["speedup_gain50"]) and s["speedup_gain50_bound"] == "n/a"
    assert s["t_baseline_s"] == 10.0  # T = 0.495 is still defined and reached


def test_other_gain_fractions_reach_the_row_and_its_intervals():
    # 60 % of the gain 0.5 -> 0.9: level 0.74, GRPO at 10 + 0.14 / 0.2 * 10 = 17 s, PODS at 0.24 / 0.3 * 10 = 8 s
    pods = [0.5, 0.8, 0.9, 0.9, 0.9]
    exp = make_experiment({"grpo": [BASE, BASE], "pods": [pods, pods]})
    kw = dict(n_bootstrap=20, progress=False, gain_fractions=(0.6,))
    row = compare_arms(exp, "grpo", "arith", "answer_acc", **kw).set_index("arm").loc["pods"]
    assert row["gain60_level"] == pytest.approx(0.74) and "gain50_level" not in row.index
    assert (row["t_baseline_gain60_s"], row["t_arm_gain60_s"]) == pytest.approx((17.0, 8.0))
    ci = (row["speedup_gain60_ci_low"], row["speedup_gain60_ci_high"])
    assert ci == pytest.approx((17.0 / 8.0, 17.0 / 8.0))  # identical seeds: every resample is the point


# --- the building blocks ---------------------------------------------------------------------------


def test_ratio_is_nan_without_a_baseline_time_and_zero_without_an_arm_time():
    t_base, t_arm = np.array([np.inf, np.inf, 30.0, 30.0, 30.0]), np.array([10.0, np.inf, np.inf, 0.0, 20.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = ratio(t_base, t_arm)
    np.testing.assert_array_equal(r, [np.nan, np.nan, 0.0, np.inf, 1.5])
    assert [str(w.message) for w in caught] == []  # inf / inf and 30 / 0 are expected, not warned about


def test_bounded_reports_the_censoring():
    assert bounded(30.0, 20.0, 40.0) == (1.5, "")  # nothing censored unless told
    assert bounded(30.0, 20.0, 40.0, baseline_rising=True) == (1.5, ">=")
    assert bounded(30.0, np.inf, 40.0) == (0.75, "<")  # at most 30 / 40: the arm's last checkpoint
    assert bounded(30.0, 0.0, 40.0) == (np.inf, "")  # crossed at the start
    assert bounded(30.0, 0.5, 40.0) == (60.0, "")


def test_interpolation_on_a_flat_segment_takes_its_end_without_warnings():
    # rows flat above the level, flat at it (0 / 0), and rising through it (0.7 -> 0.9 at 15 s)
    curves = np.array([[0.9, 0.9, 0.9], [0.8, 0.8, 0.8], [0.5, 0.7, 0.9]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = first_crossing(TIMES[:3], curves, np.full(3, 0.8), interpolate=True)
    assert [str(w.message) for w in caught] == []
    np.testing.assert_allclose(t, [10.0, 10.0, 15.0])


def test_mean_over_budget_between_grid_points_from_a_late_start():
    """Grid 5, 15, 25, 35 s; the first curve rises 0.01 per s from 0 at 5 s, so its mean from 5 s to a
    budget B is 0.005 * (B - 5); the second is flat at 0.4."""
    times = np.array([5.0, 15.0, 25.0, 35.0])
    curves = np.array([[0.0, 0.1, 0.2, 0.3], [0.4, 0.4, 0.4, 0.4]])
    np.testing.assert_allclose(mean_over_budget(times, curves, 20.0), [0.075, 0.4])  # between 15 and 25
    np.testing.assert_allclose(mean_over_budget(times, curves, 25.0), [0.1, 0.4])  # on a grid point
    np.testing.assert_allclose(mean_over_budget(times, curves, 32.0), [0.135, 0.4])
    # half a second short of the budget: undefined, one NaN per curve
    np.testing.assert_array_equal(mean_over_budget(times, curves, 35.5), [np.nan, np.nan])


def test_the_common_window_starts_at_95_percent_of_the_baselines_budget():
    # the arm ends at 38 s = 0.95 * 40 s: both means are taken over 38 s (not NaN for the arm)
    base = ArmCurves("grpo", TIMES, np.array([BASE]))
    arm = ArmCurves("pods", np.array([0.0, 10.0, 20.0, 30.0, 38.0]), np.array([[0.5, 0.8, 0.9, 0.9, 0.9]]))
    s = pair_statistics(base, base.curve()[None], arm, arm.curve()[None], q=0.99)
    # GRPO 5.5 + 7 + 8.5 + 0.9 * 8, PODS 6.5 + 8.5 + 9 + 0.9 * 8, over 38 s
    assert s["mean_base"][0] == pytest.approx(28.2 / 38) and s["mean_arm"][0] == pytest.approx(31.2 / 38)
    assert s["peak_base"][0] == 0.9 and s["threshold"][0] == pytest.approx(0.891)


def read_terminal(master: int) -> str:
    text = b""
    while select.select([master], [], [], 0.1)[0]:
        text += os.read(master, 65536)
    return text.decode(errors="replace")


def test_progress_bar_on_a_terminal_names_the_experiment_unless_silenced(monkeypatch):
    exp = make_experiment({"grpo": [BASE], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]]})
    master, replica = os.openpty()
    fcntl.ioctl(replica, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    terminal = os.fdopen(replica, "w")
    monkeypatch.setattr(sys, "stderr", terminal)
    try:
        compare_arms(exp, "grpo", "arith", "answer_acc", n_bootstrap=0)  # progress by default
        terminal.flush()
        shown = read_terminal(master)
        compare_arms(exp, "grpo", "arith", "answer_acc", n_bootstrap=0, progress=False)
        terminal.flush()
        silenced = read_terminal(master)
    finally:
        terminal.close()
        os.close(master)
    assert "x: bootstrap: 100%" in shown and " 2/2 " in shown
    assert re.search(r"\d(arm/s|s/arm)\]", shown), shown  # counted in arms
    assert silenced == ""
