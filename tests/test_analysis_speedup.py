"""The time-to-peak statistic, its companions and the bootstrap, on hand-made curves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pods_bench.analysis.speedup import ArmCurves, bootstrap_ci, compare_arms, first_crossing, mean_over_budget
from pods_bench.analysis.tidy import EVAL_COLUMNS, STEP_TIME_COLUMNS, Results, arm_table

TIMES = np.array([0.0, 10.0, 20.0, 30.0, 40.0])


def make_experiment(arms: dict[str, list[list[float]]], times=TIMES) -> Results:
    """Arms {name: one curve per seed} -> a Results; the first arm is GRPO-like (n == m)."""
    rows, arm_rows, step_rows = [], [], []
    for i, (arm, seeds) in enumerate(arms.items()):
        arm_rows.append(dict(arm=arm, n=8 if i == 0 else 32, m=8, rule="all" if i == 0 else "max_variance"))
        for seed, curve in enumerate(seeds):
            step_rows.append(dict(experiment="x", arm=arm, seed=seed, phase="total", seconds_per_step=1.0 + i))
            for t, v in zip(times, curve):
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


def test_single_seed_has_no_interval():
    s = compare({"grpo": [BASE], "pods": [[0.5, 0.8, 0.9, 0.9, 0.9]]}, n_bootstrap=500).loc["pods"]
    assert np.isnan(s["speedup_ci_low"]) and np.isnan(s["peak_ci_high"])
    assert s["n_bootstrap"] == 0 and s["speedup"] == pytest.approx(1.5)


def test_mean_accuracy_uses_the_common_window_when_arms_end_a_step_apart():
    """Own runs stop once the clock passes the budget, so the arm's last checkpoint may come a
    fraction of a step before the baseline's; the mean over the budget must still be defined."""
    from pods_bench.analysis.speedup import pair_statistics

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
