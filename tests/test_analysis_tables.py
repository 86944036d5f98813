"""The summary tables of pods_bench/analysis/tables.py, text and values, on hand-made runs whose numbers are
worked out here by hand: the cost, waste, MLPerf and speedup tables (markdown and LaTeX), the files
`write_summary` writes, the curves table and what `summarize` hands on to the comparisons.

The runs: tests/test_time_to_target.py's `experiment` (checkpoints every 10 s, 100 problems, one repeat,
2 s per evaluation, seed s's raw times 0.1 x s late), three seeds alike per arm, on tests/test_analysis_runs.py's
curves: grpo reaches T = 0.99 x 0.9 = 0.891 at 40 s, pods at 20 s, and a_slow (0.2 .. 0.7) never."""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial

import numpy as np
import pandas as pd
import pytest

from pods_bench.analysis.robustness import robustness_table
from pods_bench.analysis.speedup import compare_arms
from pods_bench.analysis.tables import (
    SUMMARY_FILES,
    AnalysisOptions,
    caption,
    cost_markdown,
    cost_table,
    curve_table,
    latex_table,
    markdown_table,
    mlperf_markdown,
    summarize,
    verdict_lines,
    waste_markdown,
    waste_table,
    write_summary,
)
from pods_bench.analysis.tidy import WASTE_COLUMNS, WASTE_FIELDS
from pods_bench.analysis.time_to_target import MLPERF_COLUMNS, mlperf_table
from tests.test_analysis_runs import CURVES
from tests.test_time_to_target import experiment as hand_experiment

SLOW = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7]  # below T (0.891) and below 80 % of grpo's gain (0.76) throughout
ROLLOUTS_PER_CHECKPOINT = {"grpo": 1000, "pods": 1500, "a_slow": 1200}
# per run, its mean per step; pods' two seeds differ so that the table shows their mean. grpo's log predates
# rollouts_not_trained (NaN), a_slow generated nothing
WASTE_RUNS = [
    # arm, seed, num_gen_batches, generated, not trained, frac_reward_zero_std, discarded: zero std, surplus, low std
    ("pods", 0, 1.0, 1279.0, 960.0, 0.123, 0.5, 0.0, 0.25),
    ("pods", 1, 1.5, 1281.0, 960.0, 0.1242, 0.6, 0.0, 0.25),
    ("grpo", 0, 1.0, 64.0, np.nan, 0.0, 0.0, 0.0, 0.0),
    ("a_slow", 0, 1.0, 0.0, 0.0, np.nan, np.nan, np.nan, np.nan),
]


def hand_results(cost_axes=("rollouts", "tokens", "flops")):
    """grpo, a_slow and pods (display order: GRPO-style first, then by name), three seeds each. Checkpoint k
    has spent k x ROLLOUTS_PER_CHECKPOINT rollouts, 20 completion tokens and 2e6 FLOPs a rollout; the
    axes not in `cost_axes` are not counted (NaN)."""
    exp = hand_experiment(
        {arm: {seed: values for seed in range(3)} for arm, values in {**CURVES, "a_slow": SLOW}.items()}
    )
    evals = exp.evals.copy()
    rollouts = evals["step"] // 10 * evals["arm"].map(ROLLOUTS_PER_CHECKPOINT)  # step = 10 k
    for axis, per_rollout in (("rollouts", 1), ("tokens", 20), ("flops", 2e6)):
        evals[axis] = rollouts * per_rollout if axis in cost_axes else np.nan
    waste = pd.DataFrame([("hand", *run) for run in WASTE_RUNS], columns=WASTE_COLUMNS)
    return replace(exp, evals=evals, waste=waste, hardware="2×H100")


@pytest.fixture(scope="module")
def summary():
    return summarize(hand_results(), AnalysisOptions(n_bootstrap=200, target=0.85), progress=False)


def rows(markdown: str) -> list[list[str]]:
    """A markdown table's cells, header first, without the alignment row."""
    lines = [line for line in markdown.splitlines() if line.startswith("|") and not line.startswith("|:")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


# --- the speedup table: markdown, LaTeX and caption ------------------------------------------------

# every number by hand: grpo crosses T at 30 + 10 x 0.091 / 0.1 = 39.1 s interpolated, pods at
# 10 + 10 x 0.291 / 0.3 = 19.7 s (1.98x); 80 % of grpo's gain (0.2 -> 0.9) is 0.76: grpo at 28 s, pods at
# 15.33 s (1.83x); a_slow never reaches T: upper bounds over its last checkpoint, 40 / 50 = 0.80x,
# 39.1 / 50 = 0.78x, 28 / 50 = 0.56x, and its resampled ratios are finite / inf = 0. Means over the 50 s
# budget by trapezoids: grpo 32.5 / 50, a_slow 22.5 / 50, pods 38.5 / 50. Seeds alike: point intervals.
# SE at T: sqrt(0.9 x 0.1 / 100) = 3.00 points, over 3 seeds 1.73; the band T..peak 0.01 x 0.9 = 0.90 points
CAPTION = (
    "hand: arith answer_acc, training on 2×H100. T = 0.99 x peak of grpo = 89.10 %; speedup = time for grpo to "
    "reach T / time for the arm (first checkpoint at or above T; grpo reaches T at 40 s). Budget 50 s (grpo's last "
    "checkpoint). [95 % CI]: percentile bootstrap over seeds, 200 resamples. '<': the arm never reaches T (upper "
    "bound); '>=': the baseline peaks at its last checkpoint (lower bound). Interp.: crossing times interpolated "
    "between checkpoints. Gain: time to reach start + 0.8 x (grpo peak - start), interpolated. Mean acc. over "
    "budget: area under the curve / grpo's budget. Evaluation noise at T: binomial SE 3.00 points for one run, "
    "1.73 for the mean of 3 seeds; the band T..peak is 0.90 points."
)


def test_the_markdown_speedup_table_pins_every_cell(summary):
    assert markdown_table(summary) == CAPTION + "\n\n" + "\n".join([
        "| Arm             | n/m   | Rule         | Seeds   | Peak (%)          | Time to T   | Speedup             | Speedup (interp.)   | Speedup to 80% of gain   | Mean acc. over budget (%)   | s/step   |",
        "|:----------------|:------|:-------------|:--------|:------------------|:------------|:--------------------|:--------------------|:-------------------------|:----------------------------|:---------|",
        "| grpo (baseline) | 8/8   | all          | 3       | 90.0 [90.0, 90.0] | 40 s        | 1.00x               | 1.00x               | 1.00x                    | 65.0 [65.0, 65.0]           |          |",
        "| a_slow          | 16/8  | max variance | 3       | 70.0 [70.0, 70.0] | > 50 s      | <0.80x [0.00, 0.00] | <0.78x [0.00, 0.00] | <0.56x [0.00, 0.00]      | 45.0 [45.0, 45.0]           |          |",
        "| pods            | 16/8  | max variance | 3       | 90.0 [90.0, 90.0] | 20 s        | 2.00x [2.00, 2.00]  | 1.98x [1.98, 1.98]  | 1.83x [1.83, 1.83]       | 77.0 [77.0, 77.0]           |          |",
    ]) + "\n"  # fmt: skip


def test_the_latex_table_escapes_the_caption_and_arm_names_and_marks_bounds(summary):
    """%, _ and × escaped in the caption, '<' and '>=' as math; a_slow's `_` escaped; its bounds as $<$ in
    every speedup column, the gain's included; one left-aligned column, ten right-aligned."""
    text = (
        "hand: arith answer\\_acc, training on 2$\\times$H100. T = 0.99 x peak of grpo = 89.10 \\%; speedup = time "
        "for grpo to reach T / time for the arm (first checkpoint at or above T; grpo reaches T at 40 s). Budget 50 s "
        "(grpo's last checkpoint). [95 \\% CI]: percentile bootstrap over seeds, 200 resamples. '$<$': the arm never "
        "reaches T (upper bound); '$\\geq$': the baseline peaks at its last checkpoint (lower bound). Interp.: "
        "crossing times interpolated between checkpoints. Gain: time to reach start + 0.8 x (grpo peak - start), "
        "interpolated. Mean acc. over budget: area under the curve / grpo's budget. Evaluation noise at T: binomial "
        "SE 3.00 points for one run, 1.73 for the mean of 3 seeds; the band T..peak is 0.90 points."
    )
    assert latex_table(summary) == "\n".join([
        "\\begin{table}",
        "\\caption{" + text + "}",
        "\\label{tab:hand}",
        "\\begin{tabular}{lrrrrrrrrrr}",
        "\\toprule",
        "Arm & n/m & Rule & Seeds & Peak (\\%) & Time to T & Speedup & Speedup (interp.) & Speedup to 80\\% of gain & Mean acc. over budget (\\%) & s/step \\\\",
        "\\midrule",
        "grpo (baseline) & 8/8 & all & 3 & 90.0 [90.0, 90.0] & 40 s & 1.00x & 1.00x & 1.00x & 65.0 [65.0, 65.0] &  \\\\",
        "a\\_slow & 16/8 & max variance & 3 & 70.0 [70.0, 70.0] & > 50 s & $<$0.80x [0.00, 0.00] & $<$0.78x [0.00, 0.00] & $<$0.56x [0.00, 0.00] & 45.0 [45.0, 45.0] &  \\\\",
        "pods & 16/8 & max variance & 3 & 90.0 [90.0, 90.0] & 20 s & 2.00x [2.00, 2.00] & 1.98x [1.98, 1.98] & 1.83x [1.83, 1.83] & 77.0 [77.0, 77.0] &  \\\\",
        "\\bottomrule",
        "\\end{tabular}",
        "\\end{table}",
        "",
    ])  # fmt: skip


def test_the_caption_says_no_cis_without_resampling_and_how_a_calibrated_budget_was_set(summary):
    calibration = {
        "arm": "grpo", "steps": 40, "untimed_steps": 2, "timed_steps": 2, "side_by_side": 1,
        "seconds_per_step": 1.25, "budget_s": 50.0, "checkpoint_every_s": 10.0, "cap_s": None, "capped": False,
    }  # fmt: skip
    plain = replace(
        summary,
        experiment=replace(summary.experiment, calibration=calibration),
        speedups=summary.speedups.assign(n_bootstrap=0),
    )
    assert (
        "Budget 50 s (grpo's last checkpoint); set as 40 steps of grpo at 1.25 s/step, timed here before the runs "
        "(median of 2 steps): 50.0 s of training clock for every arm (a run stops after the step that passes it), "
        "a checkpoint every 10.00 s. No CIs (single seed or no resampling). '<': the arm never reaches T"
    ) in caption(plain)


def test_a_metric_without_a_binomial_se_gets_no_noise_sentence_in_the_caption():
    """A length (20 .. 70 tokens) has no binomial SE at T: the caption ends with its own last sentence."""
    exp = hand_experiment({"grpo": {seed: [0.2] * 6 for seed in range(2)}})
    evals = exp.evals.copy()
    length = evals["metric"] == "format_acc"
    evals.loc[length, "metric"] = "mean_length"
    evals.loc[length, "value"] = 20.0 + evals.loc[length, "step"]  # step = 10 k: 20, 30, .. 70
    summary = summarize(
        replace(exp, evals=evals), AnalysisOptions(metric="mean_length", n_bootstrap=0), progress=False
    )
    assert caption(summary).endswith("Mean acc. over budget: area under the curve / grpo's budget.")


def test_an_experiment_of_the_baseline_alone_gets_its_caption_and_table():
    """One arm: one row of speedups, which the caption reads its threshold and times from."""
    exp = hand_experiment({"grpo": {seed: CURVES["grpo"] for seed in range(2)}})
    text = markdown_table(summarize(exp, AnalysisOptions(n_bootstrap=0), progress=False))
    assert "T = 0.99 x peak of grpo = 89.10 %;" in text and "grpo reaches T at 40 s). Budget 50 s" in text
    assert rows(text)[1][:6] == ["grpo (baseline)", "8/8", "all", "2", "90.0", "40 s"]


# --- the cost axes and the wasted work ------------------------------------------------------------

COST_HEAD = (
    "hand: arith answer_acc against what each arm spent. Per axis, speedup = grpo's cost to reach T over the arm's "
    "(T as in speedups.md), the crossing interpolated between checkpoints; to 80 % of gain likewise for start + 0.8 "
    "x (grpo peak - start). [95 % CI]: bootstrap over seeds; '<': the arm never reaches the level (upper bound); "
    "'>=': grpo peaks at its last checkpoint (lower bound). FLOPs: generation, update, reference and reward passes "
    "(docs/results-format.md)."
)


def test_cost_md_gives_each_axis_its_interpolated_costs_and_speedups(summary):
    """Rollouts: grpo (1,000 a checkpoint) crosses T 3.91 checkpoints in, 3,910 rollouts; pods (1,500) 1.97 in,
    2,955: 3910 / 2955 = 1.32x; at the first checkpoint at or above T 4,000 / 3,000 = 1.33x (no interval in that
    column); to 0.76 (80 % of gain) 2.8 x 1,000 / (1.533 x 1,500) = 2,800 / 2,300 = 1.22x. a_slow never: bounds
    over its last checkpoint's 5 x 1,200 = 6,000: 3,910 / 6,000 = 0.65x, 2,800 / 6,000 = 0.47x, 4,000 / 6,000 =
    0.67x. Tokens 20 a rollout: the same ratios; FLOPs 2e6 a rollout: past a million, 3 significant digits."""
    expected = "\n\n".join([
        COST_HEAD,
        "### rollouts",
        "\n".join([
            "| Arm             | n/m   | rollouts to T   | Speedup to T (interp.)   | Speedup to 80 % of gain   | Speedup to T (first checkpoint)   |",
            "|:----------------|:------|:----------------|:-------------------------|:--------------------------|:----------------------------------|",
            "| grpo (baseline) | 8/8   | 3,910           | 1.00x                    | 1.00x                     | 1.00x                             |",
            "| a_slow          | 16/8  | never           | <0.65x [0.00, 0.00]      | <0.47x [0.00, 0.00]       | <0.67x                            |",
            "| pods            | 16/8  | 2,955           | 1.32x [1.32, 1.32]       | 1.22x [1.22, 1.22]        | 1.33x                             |",
        ]),
        "### completion tokens",
        "\n".join([
            "| Arm             | n/m   | completion tokens to T   | Speedup to T (interp.)   | Speedup to 80 % of gain   | Speedup to T (first checkpoint)   |",
            "|:----------------|:------|:-------------------------|:-------------------------|:--------------------------|:----------------------------------|",
            "| grpo (baseline) | 8/8   | 78,200                   | 1.00x                    | 1.00x                     | 1.00x                             |",
            "| a_slow          | 16/8  | never                    | <0.65x [0.00, 0.00]      | <0.47x [0.00, 0.00]       | <0.67x                            |",
            "| pods            | 16/8  | 59,100                   | 1.32x [1.32, 1.32]       | 1.22x [1.22, 1.22]        | 1.33x                             |",
        ]),
        "### FLOPs",
        "\n".join([
            "| Arm             | n/m   | FLOPs to T   | Speedup to T (interp.)   | Speedup to 80 % of gain   | Speedup to T (first checkpoint)   |",
            "|:----------------|:------|:-------------|:-------------------------|:--------------------------|:----------------------------------|",
            "| grpo (baseline) | 8/8   | 7.82e+09     | 1.00x                    | 1.00x                     | 1.00x                             |",
            "| a_slow          | 16/8  | never        | <0.65x [0.00, 0.00]      | <0.47x [0.00, 0.00]       | <0.67x                            |",
            "| pods            | 16/8  | 5.91e+09     | 1.32x [1.32, 1.32]       | 1.22x [1.22, 1.22]        | 1.33x                             |",
        ]),
    ])  # fmt: skip
    assert cost_markdown(summary) == expected + "\n" + waste_markdown(summary)
    assert cost_markdown(summary).endswith("| 0.25                        |\n")  # the waste table closes it


def test_cost_md_skips_an_axis_the_checkpoints_do_not_count():
    """Tokens not counted: the rollouts and FLOPs tables, then the wasted work; the cost table has no token rows."""
    exp = hand_results(cost_axes=("rollouts", "flops"))
    cost = cost_table(exp, partial(compare_arms, exp, "grpo", "arith", "answer_acc", n_bootstrap=0))
    assert cost["axis"].tolist() == ["rollouts"] * 3 + ["flops"] * 3
    summary = summarize(exp, AnalysisOptions(n_bootstrap=0), progress=False)
    headings = [line for line in cost_markdown(summary).splitlines() if line.startswith("### ")]
    assert headings == ["### rollouts", "### FLOPs", "### Wasted work per step"]


def test_cost_table_is_compare_arms_on_each_cost_axis_with_the_axis_first():
    exp = hand_results()
    compare = partial(compare_arms, exp, "grpo", "arith", "answer_acc", n_bootstrap=0)
    cost = cost_table(exp, compare)
    expected = pd.concat(
        [compare(progress=False, axis=axis).assign(axis=axis) for axis in ("rollouts", "tokens", "flops")],
        ignore_index=True,
    )
    assert cost.columns[0] == "axis" and sorted(cost.columns) == sorted(expected.columns)
    assert cost.index.tolist() == list(range(9))  # one index over the three blocks
    pd.testing.assert_frame_equal(cost, expected[cost.columns])


def test_without_cost_axes_cost_md_says_so_and_the_tables_are_empty_with_their_columns():
    exp = hand_results(cost_axes=())
    summary = summarize(replace(exp, waste=None), AnalysisOptions(n_bootstrap=0), progress=False)
    assert summary.cost.empty and summary.cost.columns.tolist() == ["axis"]
    assert summary.waste.empty and summary.waste.columns.tolist() == ["arm", "seeds", *WASTE_FIELDS]
    # no waste table either: the one line and nothing after it
    assert cost_markdown(summary) == "hand: no cost axes (the checkpoints do not count rollouts, tokens or FLOPs).\n"
    assert waste_markdown(summary) == ""
    with_waste = replace(summary, waste=waste_table(exp))
    assert cost_markdown(with_waste) == (
        "hand: no cost axes (the checkpoints do not count rollouts, tokens or FLOPs).\n" + waste_markdown(with_waste)
    )


def test_waste_table_averages_each_runs_means_over_seeds_in_display_order():
    """The runs are listed pods, pods, grpo, a_slow; the table follows the arms' display order."""
    table = waste_table(hand_results()).set_index("arm")
    assert table.index.tolist() == ["grpo", "a_slow", "pods"]
    assert table.columns.tolist() == ["seeds", *WASTE_FIELDS]
    pods = table.loc["pods"]
    assert pods["seeds"] == 2 and pods["num_gen_batches"] == pytest.approx(1.25)  # (1.0 + 1.5) / 2
    assert pods["rollouts_generated"] == pytest.approx(1280.0) and pods["rollouts_not_trained"] == 960.0
    assert pods["frac_reward_zero_std"] == pytest.approx(0.1236)  # (0.123 + 0.1242) / 2
    assert pods["groups_discarded_zero_std"] == pytest.approx(0.55)
    assert np.isnan(table.loc["grpo", "rollouts_not_trained"]) and table.loc["grpo", "seeds"] == 1


def test_waste_md_prints_each_field_to_its_own_digits(summary):
    """Generation batches and groups discarded to 2 decimals, rollouts to 1 with thousands separators,
    frac_reward_zero_std to 3, the share as a whole percentage (960 / 1,280 = 75 %); "-" for a field the log
    lacks, and no share without rollouts not trained (grpo) or without rollouts generated (a_slow). The
    cells are printed as formatted: 1.00 stays 1.00 and 1,280.0 stays 1,280.0."""
    assert waste_markdown(summary) == (
        "\n### Wasted work per step\n\nMeans per step (each run's mean, then the mean over seeds), named as TRL and "
        "verl name them: generation batches (verl's num_gen_batches), rollouts generated but not trained (PODS's "
        "n - m per group, discarded groups, uncommitted pilots), the share of groups whose n rewards are all equal "
        "(TRL's frac_reward_zero_std), and the groups rolled out but not trained, by reason "
        "(docs/results-format.md).\n\n"
        + "\n".join([
            "| Arm    | Seeds   | Generation batches   | Rollouts generated   | Not trained   | Share not trained   | frac_reward_zero_std   | Groups discarded: zero std   | Groups discarded: surplus   | Groups discarded: low std   |",
            "|:-------|:--------|:---------------------|:---------------------|:--------------|:--------------------|:-----------------------|:-----------------------------|:----------------------------|:----------------------------|",
            "| grpo   | 1       | 1.00                 | 64.0                 | -             | -                   | 0.000                  | 0.00                         | 0.00                        | 0.00                        |",
            "| a_slow | 1       | 1.00                 | 0.0                  | 0.0           | -                   | -                      | -                            | -                           | -                           |",
            "| pods   | 2       | 1.25                 | 1,280.0              | 960.0         | 75%                 | 0.124                  | 0.55                         | 0.00                        | 0.25                        |",
        ])
        + "\n"
    )  # fmt: skip


def test_cost_md_keeps_a_count_below_a_million_beside_one_above_as_printed(summary):
    """A column of counts below and above a million: each cell as format_count wrote it (not 999999)."""
    cost = summary.cost[summary.cost["axis"] == "tokens"].copy()
    cost["t_arm_interp_s"] = [999_999.4, 2.5e7, 1.2e6]
    text = cost_markdown(replace(summary, cost=cost))
    assert [row[2] for row in rows(text)[:4]] == ["completion tokens to T", "999,999", "2.5e+07", "1.2e+06"]


# --- the MLPerf table -----------------------------------------------------------------------------

MLPERF_HEAD = (
    "# Time to a fixed target, MLPerf Training's rules (arith answer_acc)\n\n"
    "Target 85.00 % (analysis.target; MLPerf fixes it before the timed runs, from reference runs). A run's time "
    "is its training clock at the first checkpoint at or above the target plus every evaluation up to it (MLPerf "
    "keeps evaluation on the clock); a run that never reaches the target counts as the slowest, and more than one "
    "such run invalidates the arm's result. IQM: the interquartile mean of the runs' times, percentile-bootstrap "
    'interval over runs ("never": an infinite time inside it).\n\n'
)


def test_mlperf_md_gives_each_arms_time_its_evaluation_share_and_speedups(summary):
    """Target 0.85: grpo's runs reach it at 40 s + 0.1 x seed, plus 5 evaluations of 2 s: 50.0, 50.1, 50.2 s;
    without the fastest and the slowest, 50.1 s, of it evaluation 10 / 50.1 = 20 %. pods at 20 s and 3
    evaluations: 26.1 s, 6 / 26.1 = 23 %, 50.1 / 26.1 = 1.92x. a_slow never: 3 missed, invalid, IQM never and
    50.1 / inf = 0.00x. The IQM of 3 runs is their mean; the interval's ends are the fastest and the slowest run
    (each alone fills a resample with probability 1 / 27, above 2.5 %)."""
    assert mlperf_markdown(summary) == MLPERF_HEAD + "\n".join([
        "| arm             | runs         | MLPerf time (drop fastest + slowest)   | of it evaluation   | MLPerf speedup   | IQM time [95 % CI]    | IQM speedup   |",
        "|:----------------|:-------------|:---------------------------------------|:-------------------|:-----------------|:----------------------|:--------------|",
        "| grpo (baseline) | 3 (0 missed) | 50.1 s                                 | 20 %               | 1.00x            | 50.1 s [50 s, 50.2 s] | 1.00x         |",
        "| a_slow          | 3 (3 missed) | invalid (> 1 run missed)               |                    |                  | never [never, never]  | 0.00x         |",
        "| pods            | 3 (0 missed) | 26.1 s                                 | 23 %               | 1.92x            | 26.1 s [26 s, 26.2 s] | 1.92x         |",
    ]) + "\n"  # fmt: skip


def test_mlperf_md_rounds_in_the_experiments_unit_and_leaves_missing_values_blank(summary):
    """In minutes 26.1 s is 0.435 min; a share of 0.254 is 25 % (not 25.4 or 26), 1.236 is 1.24x; no interval
    without resamples, no IQM speedup without the baseline's."""
    m = summary.mlperf.set_index("arm")
    m.loc["pods", ["eval_share", "olympic_speedup", "iqm_speedup"]] = [0.254, 1.236, np.nan]
    m.loc["pods", ["iqm_ci_low_s", "iqm_ci_high_s"]] = np.nan
    in_minutes = replace(summary, mlperf=m.reset_index(), experiment=replace(summary.experiment, time_unit="min"))
    assert rows(mlperf_markdown(in_minutes))[3] == [
        "pods", "3 (0 missed)", "0.435 min", "25 %", "1.24x", "0.435 min", ""
    ]  # fmt: skip


def test_without_a_target_the_mlperf_table_is_empty_and_the_md_says_how_to_fix_one():
    summary = summarize(hand_results(cost_axes=()), AnalysisOptions(n_bootstrap=0), progress=False)
    assert summary.mlperf.empty and summary.mlperf.columns.tolist() == MLPERF_COLUMNS
    assert mlperf_markdown(summary) == (
        "# Time to a fixed target, MLPerf Training's rules (arith answer_acc)\n\nNo target fixed: set "
        "`analysis.target` in the experiment config to a value derived before the runs from separate baseline seeds "
        "(`pods-bench target <reference runs> --arm <baseline>`).\n"
    )


# --- the curves table -----------------------------------------------------------------------------


def test_curve_table_gives_mean_sd_sem_t_interval_and_binomial_se_per_checkpoint():
    """Two seeds, accuracy 0.0 and 0.1 at the start, 0.9 and 1.0 at 10 s: mean 0.05 (0.95), sd sqrt(0.005),
    sem 0.05, t(0.975, 1 df) = 12.706: half-width 0.635, clipped into [0, 1] for an accuracy; the binomial SE
    of one run sqrt(0.05 x 0.95 / 100), of the mean / sqrt(2). A length (1 and 2 at every checkpoint) is not
    clipped (1.5 -+ 6.35) and has no binomial SE."""
    exp = hand_experiment({"grpo": {0: [0.0, 0.9, 0.9, 0.9, 0.9, 0.9], 1: [0.1, 1.0, 1.0, 1.0, 1.0, 1.0]}})
    evals = exp.evals.copy()
    length = evals["metric"] == "format_acc"
    evals.loc[length, "metric"] = "mean_length"
    evals.loc[length, "value"] = 1.0 + evals.loc[length, "seed"]
    curves = curve_table(replace(exp, evals=evals)).set_index(["metric", "time_s"])
    half = 12.706205 * 0.05
    start, later, long = (
        curves.loc[("answer_acc", 0.0)],
        curves.loc[("answer_acc", 10.0)],
        curves.loc[("mean_length", 0.0)],
    )
    assert (start["mean"], start["n_seeds"], start["n_problems"], start["n_repeats"]) == (
        pytest.approx(0.05),
        2,
        100,
        1,
    )
    assert start["sd"] == pytest.approx(0.005**0.5) and start["sem"] == pytest.approx(0.05)
    assert (start["ci_low"], start["ci_high"]) == (0.0, pytest.approx(0.05 + half))  # 0.05 - 0.635 clipped at 0
    assert (later["ci_low"], later["ci_high"]) == (pytest.approx(0.95 - half), 1.0)  # 0.95 + 0.635 clipped at 1
    assert start["binomial_se"] == pytest.approx((0.05 * 0.95 / 100) ** 0.5)
    assert start["binomial_se_mean"] == pytest.approx((0.05 * 0.95 / 100) ** 0.5 / 2**0.5)
    assert (long["mean"], long["sem"]) == (pytest.approx(1.5), pytest.approx(0.5))
    assert (long["ci_low"], long["ci_high"]) == (pytest.approx(1.5 - 10 * half), pytest.approx(1.5 + 10 * half))
    assert np.isnan(long["binomial_se"]) and np.isnan(long["binomial_se_mean"])
    assert curves["binomial_se"].dtype == np.float64


def test_curve_table_is_sorted_by_benchmark_metric_arm_in_display_order_and_time():
    """a_slow sorts before grpo by name, after it in display order (GRPO-style arms first)."""
    exp = hand_experiment({"a_slow": {0: SLOW}, "grpo": {0: CURVES["grpo"]}})
    curves = curve_table(exp)
    assert curves.index.tolist() == list(range(24))
    keys = list(zip(curves["metric"], curves["arm"], curves["time_s"]))
    times = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    order = [(metric, arm, t) for metric in ("answer_acc", "format_acc") for arm in ("grpo", "a_slow") for t in times]
    assert keys == order


# --- summarize: the options reach every table -----------------------------------------------------


def varied_curves(n_seeds: int = 8) -> dict[str, dict[int, list[float]]]:
    """CURVES' grpo and pods with each seed's checkpoints after the start moved by its own draw in +-0.05: seeds
    that differ, so that the resamples' seed shows in the intervals."""
    rng = np.random.default_rng(0)
    return {
        arm: {
            seed: [values[0], *(np.array(values[1:]) + rng.uniform(-0.05, 0.05, 5)).round(3)]
            for seed in range(n_seeds)
        }
        for arm, values in CURVES.items()
    }


def test_summarize_hands_every_option_to_the_speedups_the_mlperf_and_the_robustness_tables():
    """Options that differ from every default (the experiment's default benchmark and metric are the other
    ones here): the summary's tables are the comparisons called with exactly these."""
    curves = varied_curves()
    exp = hand_experiment(curves, extra_benchmark=True)
    starts = [(arm, seed, "start-a" if seed < 4 else "start-b") for arm in curves for seed in curves[arm]]
    exp = replace(
        exp,
        default_benchmark="other",
        default_metric="format_acc",
        starts=pd.DataFrame(starts, columns=["arm", "seed", "start"]),
    )
    options = AnalysisOptions(benchmark="arith", metric="answer_acc", q=0.9, n_bootstrap=50, seed=3, target=0.8)
    summary = summarize(exp, options, progress=False)
    assert (summary.baseline, summary.benchmark, summary.metric, summary.options) == (
        "grpo",
        "arith",
        "answer_acc",
        options,
    )
    speedups = compare_arms(exp, "grpo", "arith", "answer_acc", q=0.9, n_bootstrap=50, seed=3, progress=False)
    pd.testing.assert_frame_equal(summary.speedups, speedups)
    peak = np.mean(list(curves["grpo"].values()), axis=0)[1:].max()  # the mean curve's highest after the start
    assert summary.speedups["threshold"].iloc[0] == pytest.approx(0.9 * peak)  # q x grpo's peak
    assert summary.speedups["speedup_ci_low"].iloc[1] < summary.speedups["speedup_ci_high"].iloc[1]  # seeds differ
    pd.testing.assert_frame_equal(summary.mlperf, mlperf_table(exp, "grpo", "arith", "answer_acc", 0.8, 50, 3))
    pd.testing.assert_frame_equal(summary.robustness, robustness_table(exp, speedups, 50, 3))
    assert set(summary.robustness["start"]) == {"start-a", "start-b", "all"}
    pd.testing.assert_frame_equal(summary.curves, curve_table(exp))


# --- the files -------------------------------------------------------------------------------------


def test_write_summary_writes_each_table_and_text_through_a_temporary_file(summary, tmp_path, monkeypatch):
    """Thirteen files in <out>/hand/summary, each first written beside it as `.<name>.<random>.tmp<suffix>`
    and renamed over it; the CSVs without an index column."""
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renames.append((src, dst)), real_replace(src, dst))[1])
    paths = write_summary(summary, tmp_path)
    folder = tmp_path / "hand" / "summary"
    order = ["speedups.csv", "curves.csv", "step_times.csv", "cost.csv", "waste.csv", "mlperf.csv", "robustness.csv",
             "speedups.md", "speedups.tex", "cost.md", "mlperf.md", "robustness.md", "verdict.md"]  # fmt: skip
    assert paths == [folder / name for name in order] and sorted(order) == sorted(SUMMARY_FILES)
    assert sorted(p.name for p in folder.iterdir()) == sorted(order)  # no temporary file left
    assert len(renames) == 13
    for (src, dst), path in zip(renames, paths):
        src = os.fspath(src)
        assert os.fspath(dst) == os.fspath(path) and os.path.dirname(src) == os.fspath(folder)
        assert os.path.basename(src).startswith(f".{path.name}.") and src.endswith(f".tmp{path.suffix}")

    tables = {"speedups.csv": summary.speedups, "curves.csv": summary.curves, "cost.csv": summary.cost,
              "waste.csv": summary.waste, "mlperf.csv": summary.mlperf, "robustness.csv": summary.robustness}  # fmt: skip
    for name, table in tables.items():
        assert (folder / name).read_text() == table.to_csv(index=False), name
    assert (folder / "step_times.csv").read_text() == "experiment,arm,seed,phase,seconds_per_step\n"  # no step log
    assert (folder / "waste.csv").read_text().splitlines()[:2] == [
        "arm,seeds,num_gen_batches,rollouts_generated,rollouts_not_trained,frac_reward_zero_std,"
        "groups_discarded_zero_std,groups_discarded_surplus,groups_discarded_low_std",
        "grpo,1,1.0,64.0,,0.0,0.0,0.0,0.0",
    ]
    mlperf = pd.read_csv(folder / "mlperf.csv").set_index("arm")
    assert mlperf.loc["pods", "olympic_time_s"] == pytest.approx(26.1) and not mlperf.loc["a_slow", "valid"]

    assert (folder / "speedups.md").read_text() == markdown_table(summary)
    assert (folder / "speedups.tex").read_text() == latex_table(summary)
    assert (folder / "cost.md").read_text() == cost_markdown(summary)
    assert (folder / "mlperf.md").read_text() == mlperf_markdown(summary)
    assert (folder / "robustness.md").read_text() == (
        "# Do the conclusions hold on every warm start? (time to 80 % of grpo's gain)\n\n"
        "The runs share one starting model: nothing to compare (set `warm_start.seeds`).\n"
    )
    # a sentence per arm, a blank line between them; the band T..peak (0.90 points) is narrower than the SE
    # of the mean (1.73), and a_slow's upper bound and intervals are those of the table
    noise = (
        " over 3 seeds (the band from T to grpo's peak, 0.90 points, is narrower than the evaluation noise of the "
        "mean, 1.73: within noise)"
    )
    assert verdict_lines(summary) == [
        "a_slow reached 0.99 x grpo's peak at most 0.80x sooner [95 % CI 0.00, 0.00]" + noise
        + "; to 80 % of grpo's gain <0.56x [0.00, 0.00].",
        "pods reached 0.99 x grpo's peak 2.00x sooner [95 % CI 2.00, 2.00]" + noise
        + "; to 80 % of grpo's gain 1.83x [1.83, 1.83].",
    ]  # fmt: skip
    assert (folder / "verdict.md").read_text() == "\n\n".join(verdict_lines(summary)) + "\n"
    assert (folder / "verdict.md").read_text().count("\n") == 3
