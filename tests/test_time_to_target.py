"""Time to a fixed target under MLPerf's rules (pods_bench/analysis/time_to_target.py), on hand-made runs
whose times to the target are worked out here by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pods_bench.analysis.tables import AnalysisOptions, mlperf_markdown, summarize
from pods_bench.analysis.tidy import EVAL_COLUMNS, STEP_TIME_COLUMNS, Results, arm_table
from pods_bench.analysis.time_to_target import (
    interquartile_mean,
    iqm_interval,
    knee_target,
    mlperf_table,
    olympic_mean,
    run_times,
)
from pods_bench.errors import PodsBenchError

EVAL_S = 2.0  # every evaluation takes 2 s (one benchmark) and is off the training clock
GRID = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]


def experiment(curves: dict[str, dict[int, list[float]]], extra_benchmark: bool = False) -> Results:
    """arm -> seed -> accuracy at each checkpoint of GRID (training clock); each checkpoint evaluated on
    `arith` (and, with extra_benchmark, on a second benchmark whose evaluation also counts on the clock)."""
    rows = []
    for arm, seeds in curves.items():
        for seed, values in seeds.items():
            for k, (t, v) in enumerate(zip(GRID, values)):
                for benchmark in ["arith", "other"] if extra_benchmark else ["arith"]:
                    for metric in ("answer_acc", "format_acc"):
                        rows.append(
                            dict(
                                experiment="hand",
                                arm=arm,
                                seed=seed,
                                time_s=t,
                                raw_time_s=t + 0.1 * seed,  # a run's own checkpoint times
                                step=10 * k,
                                benchmark=benchmark,
                                metric=metric,
                                value=v if metric == "answer_acc" else 1.0,
                                n_repeats=1,
                                n_problems=100,
                                rollouts=np.nan,
                                tokens=np.nan,
                                flops=np.nan,
                                eval_time_s=EVAL_S,
                            )
                        )
    arms = arm_table(
        [dict(arm=a, n=16 if a != "grpo" else 8, m=8, rule="all" if a == "grpo" else "max_variance") for a in curves]
    )
    return Results(
        "hand",
        pd.DataFrame(rows, columns=EVAL_COLUMNS),
        pd.DataFrame(columns=STEP_TIME_COLUMNS),
        arms,
        "Test CPU",
        "runs",
        "arith",
        default_baseline="grpo",
    )


# target 0.5: the first checkpoint at or above it is k = 1..5 (or never)
def reaching_at(k: int | None) -> list[float]:
    return [0.1] + [0.6 if k is not None and j >= k else 0.3 for j in range(1, 6)]


def expected_time(seed: int, k: int) -> float:
    """Training clock at checkpoint k plus the k + 1 evaluations (step 0 included) up to it."""
    return GRID[k] + 0.1 * seed + (k + 1) * EVAL_S


def test_a_runs_time_is_its_clock_at_the_first_crossing_plus_every_evaluation_up_to_it():
    exp = experiment({"grpo": {0: reaching_at(2), 1: reaching_at(4), 2: reaching_at(None)}}, extra_benchmark=True)
    runs = run_times(exp, "grpo", "arith", "answer_acc", 0.5).set_index("seed")
    # two benchmarks evaluated at each checkpoint: both evaluations are on the clock
    assert runs.loc[0, "train_s"] == pytest.approx(20.0)
    assert runs.loc[0, "eval_s"] == pytest.approx(3 * 2 * EVAL_S)
    assert runs.loc[0, "time_s"] == pytest.approx(20.0 + 12.0)
    assert runs.loc[1, "time_s"] == pytest.approx(40.1 + 5 * 2 * EVAL_S)
    assert np.isinf(runs.loc[2, "time_s"])


def test_step_zero_does_not_count_as_reaching_the_target():
    exp = experiment({"grpo": {0: [0.9, 0.3, 0.3, 0.6, 0.6, 0.6]}})
    assert run_times(exp, "grpo", "arith", "answer_acc", 0.5)["train_s"].item() == pytest.approx(30.0)


def test_the_result_drops_the_fastest_and_slowest_run_and_averages_the_rest():
    ks = {0: 1, 1: 2, 2: 3, 3: 3, 4: 5}
    exp = experiment({"grpo": {s: reaching_at(k) for s, k in ks.items()}})
    row = mlperf_table(exp, "grpo", "arith", "answer_acc", 0.5, n_bootstrap=0).iloc[0]
    middle = [expected_time(s, ks[s]) for s in (1, 2, 3)]  # seed 0 fastest, seed 4 slowest
    assert row["valid"] and row["n_failed"] == 0
    assert row["olympic_time_s"] == pytest.approx(np.mean(middle))
    assert row["olympic_train_s"] == pytest.approx(np.mean([GRID[ks[s]] + 0.1 * s for s in (1, 2, 3)]))
    evals = np.mean([(ks[s] + 1) * EVAL_S for s in (1, 2, 3)])
    assert row["eval_share"] == pytest.approx(evals / np.mean(middle))


def test_one_run_that_misses_the_target_is_dropped_as_the_slowest():
    ks = {0: 1, 1: 2, 2: 3, 3: None}
    exp = experiment({"grpo": {s: reaching_at(k) for s, k in ks.items()}})
    row = mlperf_table(exp, "grpo", "arith", "answer_acc", 0.5, n_bootstrap=0).iloc[0]
    assert row["valid"] and row["n_failed"] == 1
    assert row["olympic_time_s"] == pytest.approx(np.mean([expected_time(1, 2), expected_time(2, 3)]))
    assert "inf" in row["run_times_s"]


def test_two_runs_that_miss_the_target_invalidate_the_result():
    ks = {0: 1, 1: 2, 2: None, 3: None, 4: 2}
    exp = experiment({"grpo": {s: reaching_at(k) for s, k in ks.items()}, "pods": {s: reaching_at(1) for s in ks}})
    table = mlperf_table(exp, "grpo", "arith", "answer_acc", 0.5, n_bootstrap=0).set_index("arm")
    assert not table.loc["grpo", "valid"] and table.loc["grpo", "n_failed"] == 2
    assert np.isnan(table.loc["grpo", "olympic_time_s"])
    assert np.isnan(table.loc["pods", "olympic_speedup"])  # no valid baseline result, no ratio
    summary = summarize(exp, AnalysisOptions(target=0.5, n_bootstrap=0), progress=False)
    assert "invalid (> 1 run missed)" in mlperf_markdown(summary)


def test_speedups_are_the_baselines_time_over_the_arms():
    ks_base, ks_arm = {0: 3, 1: 4, 2: 4, 3: 5}, {0: 1, 1: 2, 2: 2, 3: 3}
    exp = experiment(
        {
            "grpo": {s: reaching_at(k) for s, k in ks_base.items()},
            "pods": {s: reaching_at(k) for s, k in ks_arm.items()},
        }
    )
    table = mlperf_table(exp, "grpo", "arith", "answer_acc", 0.5, n_bootstrap=0).set_index("arm")
    base = np.mean([expected_time(1, 4), expected_time(2, 4)])
    arm = np.mean([expected_time(1, 2), expected_time(2, 2)])
    assert table.loc["pods", "olympic_speedup"] == pytest.approx(base / arm)
    assert table.loc["grpo", "olympic_speedup"] == pytest.approx(1.0)
    # the interquartile mean of 4 runs is the mean of the middle two: here the same runs
    assert table.loc["pods", "iqm_speedup"] == pytest.approx(base / arm)


def test_olympic_mean_by_hand():
    assert olympic_mean([5.0, 1.0, 3.0, 4.0])[0] == pytest.approx(3.5)
    assert olympic_mean([5.0, np.inf, 3.0, 4.0])[0] == pytest.approx(4.5)
    assert np.isnan(olympic_mean([np.inf, np.inf, 3.0, 4.0])[0])
    assert np.isnan(olympic_mean([3.0, 4.0])[0])  # nothing left after dropping two


def test_the_interquartile_mean_and_its_interval():
    times = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0])
    assert interquartile_mean(times) == pytest.approx(45.0)  # mean of 30..60
    low, high = iqm_interval(times, 2000, seed=0)
    assert 10.0 < low < 45.0 < high < 80.0
    # a 95 % interval is wider than an 80 % one would be: the 2.5th / 97.5th percentiles of the resampled IQMs
    rng = np.random.default_rng(1)
    draws = interquartile_mean(times[rng.integers(0, len(times), (4000, len(times)))], axis=1)
    assert low == pytest.approx(np.percentile(draws, 2.5), abs=3.0)
    assert high == pytest.approx(np.percentile(draws, 97.5), abs=3.0)
    assert high - low > np.percentile(draws, 90) - np.percentile(draws, 10) + 1.0
    # a never-reaching run leaves the interval open above
    assert np.isinf(iqm_interval(np.array([10.0, 20.0, 30.0, np.inf]), 500, seed=0)[1])


def test_the_target_is_the_mean_curve_just_past_its_knee():
    # a sharp knee at 10 s: the mean curve after it is 0.72, the lowest run peak 0.78
    exp = experiment({"grpo": {0: [0.1, 0.6, 0.7, 0.74, 0.76, 0.78], 1: [0.1, 0.6, 0.74, 0.78, 0.8, 0.8]}})
    t = knee_target(exp, "grpo", "arith", "answer_acc")
    assert t.knee_time_s == pytest.approx(10.0)
    assert t.at_time_s == pytest.approx(20.0) and t.value == pytest.approx(0.72) and not t.capped
    assert t.reference_seeds == (0, 1)


def test_the_target_is_lowered_to_the_lowest_reference_peak():
    # seed 1 peaks at 0.5, below the mean curve past the knee (0.6): every reference run must reach the target
    exp = experiment({"grpo": {0: [0.1, 0.6, 0.7, 0.7, 0.7, 0.7], 1: [0.1, 0.4, 0.5, 0.5, 0.5, 0.5]}})
    t = knee_target(exp, "grpo", "arith", "answer_acc")
    assert t.capped and t.value == pytest.approx(0.5)


def test_a_target_from_some_seeds_reads_only_those():
    exp = experiment({"grpo": {0: [0.1, 0.6, 0.7, 0.7, 0.7, 0.7], 5: [0.1, 0.2, 0.3, 0.3, 0.3, 0.3]}})
    assert knee_target(exp, "grpo", "arith", "answer_acc", seeds=[0]).value == pytest.approx(0.7)
    with pytest.raises(PodsBenchError, match=r"no runs with seeds \[7\]"):
        knee_target(exp, "grpo", "arith", "answer_acc", seeds=[0, 7])


def test_a_curve_without_a_knee_is_a_one_line_error():
    exp = experiment({"grpo": {0: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]}})  # still rising in a straight line
    with pytest.raises(PodsBenchError, match="no knee"):
        knee_target(exp, "grpo", "arith", "answer_acc")
