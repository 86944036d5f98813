"""Own runs in the results contract -> tables and figures, through the `aggregate` and `plot` commands.
The fixtures are written with the project's own result writers, as the trainer writes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pods_bench.analysis.figures import without_partial_bands
from pods_bench.analysis.load import load_experiments
from pods_bench.analysis.tables import SUMMARY_FILES
from pods_bench.cli import main
from pods_bench.io import append_jsonl, atomic_write_json

# accuracy at checkpoint k (every ~10 s): GRPO reaches T = 0.99 * 0.9 at 40 s, PODS at 20 s
CURVES = {"grpo": [0.2, 0.4, 0.6, 0.8, 0.9, 0.9], "pods": [0.2, 0.6, 0.9, 0.9, 0.9, 0.9]}
PHASE_SECONDS = {
    "grpo": dict(time_gen_s=0.3, time_reward_s=0.05, time_select_s=0.0, time_update_s=0.4, time_sync_s=0.02),
    "pods": dict(time_gen_s=0.3, time_reward_s=0.05, time_select_s=0.01, time_update_s=0.1, time_sync_s=0.02),
}
N_M = {"grpo": (4, 4), "pods": (16, 4)}
JITTER = {0: -0.2, 1: 0.0, 2: 0.2}  # checkpoints fire a little early or late; the median is on time


def write_run(experiment: Path, arm: str, seed: int, n_problems: int = 200) -> Path:
    folder = experiment / "runs" / arm / f"seed{seed}"
    n, m = N_M[arm]
    atomic_write_json(
        folder / "run.json",
        {
            "experiment": experiment.name,
            "arm": arm,
            "seed": seed,
            "config": {
                "selection": {"rule": "max_variance" if n > m else "all", "n": n, "m": m},
                "budget": {"checkpoint_every_s": 10.0},
            },
            "versions": {"pods-bench": "0.1.0"},
            "hardware": {"label": "Test CPU (2 threads)", "cpu": "Test CPU", "torch_threads": 2, "gpus": []},
            "started_at": "2025-01-01T00:00:00",
            "finished_at": "2025-01-01T00:01:00",
            "status": "finished",
        },
    )
    step_s = sum(PHASE_SECONDS[arm].values()) + 0.03  # 0.03 s per step not in any phase
    steps = int(55 / step_s)
    append_jsonl(
        folder / "train_log.jsonl",
        [
            dict(
                step=s,
                train_time_s=s * step_s,
                **PHASE_SECONDS[arm],
                prompts=8,
                n=n,
                m=m,
                generated_tokens=8 * n * 20,
                trained_tokens=8 * m * 20,
                flops_gen=8 * n * 1000.0,  # 1,000 a rollout generated, 3,000 a sequence trained
                flops_update=8 * m * 3000.0,
                flops_reference=0.0,
                flops_reward=0.0,
                reward_mean=0.5,
                reward_std=0.3,
                reward_mean_kept=0.5,
                reward_std_kept=0.4,
                frac_reward_zero_std=0.1,
                num_gen_batches=1,
                rollouts_generated=8 * n,
                rollouts_not_trained=8 * (n - m),
                groups_trained=8,
                prompts_kept=8 - s % 2,  # a DAPO-style filter drops one group every other step
                completion_len_mean=20.0,
                loss=0.1,
                grad_norm=1.0,
                lr=1e-4,
            )
            for s in range(1, steps + 1)
        ],
    )
    evals = []
    for k, acc in enumerate(CURVES[arm]):
        t = 0.0 if k == 0 else 10.0 * k + JITTER[seed]
        step = round(t / step_s)
        evals.append(
            dict(
                checkpoint=f"step-{step:06d}",
                step=step,
                train_time_s=t,
                benchmark="arith",
                n_problems=n_problems,
                repeats=2,
                answer_acc=[acc, acc],
                format_acc=[1.0, 1.0],
                both_acc=[acc, acc],
                mean_length=[20.0 - k, 20.0 - k],
                examples=[{"question": "Q:1+2-1=", "completion": "A:2"}],
            )
        )
    append_jsonl(folder / "eval.jsonl", evals)
    return folder


@pytest.fixture
def experiment(tmp_path) -> Path:
    root = tmp_path / "results" / "smoke-equal-rollouts"
    for arm in CURVES:
        for seed in JITTER:
            write_run(root, arm, seed)
    return root


def test_own_runs_load_into_the_tidy_table(experiment):
    (exp,), warnings = load_experiments(experiment, progress=False)
    assert warnings == [] and exp.name == "smoke-equal-rollouts" and exp.source == "runs"
    assert exp.arm_names == ["grpo", "pods"] and exp.default_baseline == "grpo"
    assert exp.arms.set_index("arm").loc["pods"].to_dict() == {"n": 16, "m": 4, "rule": "max_variance"}
    assert exp.hardware == "Test CPU (2 threads)" and exp.default_benchmark == "arith"
    acc = exp.evals[exp.evals["metric"] == "answer_acc"]
    assert sorted(acc["time_s"].unique()) == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]  # seeds aligned
    assert sorted(acc[acc["time_s"] == 10.0]["raw_time_s"]) == [9.8, 9.8, 10.0, 10.0, 10.2, 10.2]
    assert (acc["n_repeats"] == 2).all() and (acc["n_problems"] == 200).all()
    steps = exp.step_times[exp.step_times["arm"] == "pods"].groupby("phase")["seconds_per_step"].mean()
    assert steps["total"] == pytest.approx(0.51)
    assert steps[["generation", "rewards", "selection", "update", "sync", "other"]].sum() == pytest.approx(0.51)
    assert steps["other"] == pytest.approx(0.03)


def test_aggregate_and_plot_write_tables_and_figures(experiment, tmp_path, capsys):
    out, figures = tmp_path / "summary-root", tmp_path / "figures"
    assert main(["aggregate", str(experiment), "--out", str(out), "--bootstrap", "200"]) == 0
    assert "pods: speedup 2.00x" in capsys.readouterr().out
    summary = out / "smoke-equal-rollouts" / "summary"
    speedups = pd.read_csv(summary / "speedups.csv").set_index("arm")
    assert speedups.loc["pods", "speedup"] == pytest.approx(2.0)
    assert speedups.loc["pods", "threshold"] == pytest.approx(0.891)
    assert speedups.loc["pods", "speedup_ci_low"] == speedups.loc["pods", "speedup_ci_high"] == pytest.approx(2.0)
    assert speedups.loc["pods", "seconds_per_step"] == pytest.approx(0.51)
    curves = pd.read_csv(summary / "curves.csv")
    row = curves[(curves["arm"] == "grpo") & (curves["metric"] == "answer_acc") & (curves["time_s"] == 30.0)].iloc[0]
    assert row["mean"] == pytest.approx(0.8) and row["binomial_se"] == pytest.approx((0.8 * 0.2 / 400) ** 0.5)
    assert set(pd.read_csv(summary / "step_times.csv")["phase"]) >= {"total", "generation", "update", "other"}
    assert "| pods " in (summary / "speedups.md").read_text()
    assert "\\begin{tabular}" in (summary / "speedups.tex").read_text()
    assert sorted(p.name for p in summary.iterdir()) == sorted(SUMMARY_FILES)  # and no temporary files
    # on the cost axis: GRPO generates 8 x 4 rollouts per 0.8 s step and reaches T after 50 steps (40 s),
    # PODS 8 x 16 per 0.51 s step, after 39 steps (median of 39, 39, 40): 1,600 vs 4,992 rollouts
    cost = pd.read_csv(summary / "cost.csv").set_index(["axis", "arm"])
    assert cost.loc[("rollouts", "pods"), "speedup"] == pytest.approx(1600 / 4992)
    assert cost.loc[("tokens", "pods"), "speedup"] == pytest.approx(1600 / 4992)  # 20 tokens per completion
    assert cost.loc[("rollouts", "grpo"), "speedup"] == pytest.approx(1.0)
    # FLOPs: GRPO 32 x 1,000 + 32 x 3,000 a step for 50 steps, PODS 128 x 1,000 + 32 x 3,000 for 39
    assert cost.loc[("flops", "pods"), "speedup"] == pytest.approx(50 * 128_000 / (39 * 224_000))
    # cost.md: one table per axis, the interpolated crossing first; GRPO crosses T 91 % of the way
    # from its 0.8 checkpoint to its 0.9 one, so its interpolated cost is below the grid's
    text = (summary / "cost.md").read_text()
    assert [line for line in text.splitlines() if line.startswith("### ")] == [
        "### rollouts",
        "### completion tokens",
        "### FLOPs",
        "### Wasted work per step",
    ]
    # the wasted work: PODS generates 16 and trains 4 of each of 8 groups, GRPO trains all its 4
    waste = pd.read_csv(summary / "waste.csv").set_index("arm")
    assert waste.loc["pods", "rollouts_not_trained"] == 8 * 12 and waste.loc["grpo", "rollouts_not_trained"] == 0
    assert waste.loc["pods", "seeds"] == 3 and waste.loc["pods", "frac_reward_zero_std"] == pytest.approx(0.1)
    assert waste.loc["pods", "groups_discarded_surplus"] == waste.loc["pods", "groups_discarded_low_std"] == 0
    # the filter's drops (one every other step) count as zero-std discards: about 0.5 a step
    assert 0.45 < waste.loc["pods", "groups_discarded_zero_std"] < 0.55
    assert "| pods  |" in text.split("### Wasted work per step")[1] and "75%" in text
    rollouts = cost.loc[("rollouts", "pods")]
    assert rollouts["t_baseline_interp_s"] < rollouts["t_baseline_s"] == 1600
    assert f"{rollouts['speedup_interp']:.2f}x [" in text and f"{rollouts['t_arm_interp_s']:,.0f}" in text

    assert main(["plot", str(experiment), "--out", str(figures)]) == 0
    for stem in ("accuracy", "length", "accuracy-rollouts"):
        assert (figures / "smoke-equal-rollouts" / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
        assert (figures / "smoke-equal-rollouts" / f"{stem}.pdf").read_bytes()[:4] == b"%PDF"


@pytest.mark.parametrize("n_problems", [200, 20])
def test_the_verdict_says_when_the_peak_band_is_within_evaluation_noise(tmp_path, n_problems):
    """T..peak is 0.9 points; the SE of the mean of 3 seeds at T (accuracy 0.9, 2 repeats) is 0.87
    points on 200 problems and 2.7 on 20: only then is crossing T a matter of noise."""
    root = tmp_path / "results" / "noisy"
    for arm in CURVES:
        for seed in JITTER:
            write_run(root, arm, seed, n_problems=n_problems)
    assert main(["aggregate", str(root), "--out", str(tmp_path / "out"), "--bootstrap", "200"]) == 0
    verdict = (tmp_path / "out" / "noisy" / "summary" / "verdict.md").read_text()
    assert verdict.startswith("pods reached 0.99 x grpo's peak 2.00x sooner")
    within = "the band from T to grpo's peak, 0.90 points, is narrower than the evaluation noise of the mean, 2.74"
    assert (within in verdict) == (n_problems == 20), verdict
    # on 200 problems no "within noise" sentence of any wording (e.g. against one run's SE, 1.50 points)
    assert ("narrower than the evaluation noise" in verdict) == (n_problems == 20), verdict
    if n_problems == 20:
        # 80 % of grpo's gain (0.2 -> 0.9) is 0.76: grpo at 20 + 10 x 0.16 / 0.2 = 28 s, pods at
        # 10 + 10 x 0.16 / 0.3 = 15.33 s: 1.83x; every seed alike, so the intervals are points
        assert verdict == (
            "pods reached 0.99 x grpo's peak 2.00x sooner [95 % CI 2.00, 2.00] over 3 seeds (the band from T to "
            "grpo's peak, 0.90 points, is narrower than the evaluation noise of the mean, 2.74: within noise); "
            "to 80 % of grpo's gain 1.83x [1.83, 1.83].\n"
        )
        # T = 0.99 x 0.9; one run's SE at T sqrt(0.9 x 0.1 / 40) = 4.74 points, the mean's 4.74 / sqrt(3)
        caption = (tmp_path / "out" / "noisy" / "summary" / "speedups.md").read_text().split("\n\n")[0]
        assert caption.endswith(
            "T = 0.99 x peak of grpo = 89.10 %; speedup = time for grpo to reach T / time for the arm (first "
            "checkpoint at or above T; grpo reaches T at 40 s). Budget 50 s (grpo's last checkpoint). [95 % CI]: "
            "percentile bootstrap over seeds, 200 resamples. '<': the arm never reaches T (upper bound); '>=': the "
            "baseline peaks at its last checkpoint (lower bound). Interp.: crossing times interpolated between "
            "checkpoints. Gain: time to reach start + 0.8 x (grpo peak - start), interpolated. Mean acc. over "
            "budget: area under the curve / grpo's budget. Evaluation noise at T: binomial SE 4.74 points for one "
            "run, 2.74 for the mean of 3 seeds; the band T..peak is 0.90 points."
        ), caption
        # the table: peaks 0.9; crossings interpolated: grpo 30 + 10 x 0.091 / 0.1 = 39.1 s, pods
        # 10 + 10 x 0.291 / 0.3 = 19.7 s (1.98x); mean over the 50 s budget by trapezoids: grpo 32.5 / 50,
        # pods 38.5 / 50
        lines = (tmp_path / "out" / "noisy" / "summary" / "speedups.md").read_text().split("\n\n")[1].splitlines()
        cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
        assert cells[0][:10] == ["Arm", "n/m", "Rule", "Seeds", "Peak (%)", "Time to T", "Speedup", "Speedup (interp.)",
                                 "Speedup to 80% of gain", "Mean acc. over budget (%)"]  # fmt: skip
        assert cells[2][:10] == ["grpo (baseline)", "4/4", "all", "3", "90.0 [90.0, 90.0]", "40 s", "1.00x", "1.00x",
                                 "1.00x", "65.0 [65.0, 65.0]"]  # fmt: skip
        assert cells[3][:10] == ["pods", "16/4", "max variance", "3", "90.0 [90.0, 90.0]", "20 s", "2.00x [2.00, 2.00]",
                                 "1.98x [1.98, 1.98]", "1.83x [1.83, 1.83]", "77.0 [77.0, 77.0]"]  # fmt: skip


def test_the_noise_at_t_is_the_binomial_se_of_the_baseline_where_it_reaches_t(tmp_path, monkeypatch):
    """GRPO peaks at 0.92 (40 s) and ends at 0.91: T = 0.9108 is first reached at 40 s, so the noise
    is that of accuracy 0.92, not of the last checkpoint's 0.91."""
    from pods_bench.analysis.tables import AnalysisOptions, noise_at_threshold, summarize

    monkeypatch.setitem(CURVES, "grpo", [0.2, 0.4, 0.6, 0.8, 0.92, 0.91])
    root = tmp_path / "results" / "noise"
    for arm in CURVES:
        for seed in JITTER:
            write_run(root, arm, seed)
    (exp,), _ = load_experiments(root, progress=False)
    noise = noise_at_threshold(summarize(exp, AnalysisOptions(n_bootstrap=0), progress=False))
    se = (0.92 * 0.08 / (200 * 2)) ** 0.5  # 200 problems, 2 repeats
    assert noise.se_run == pytest.approx(se, rel=1e-9) and noise.se_mean == pytest.approx(se / 3**0.5, rel=1e-9)
    assert noise.band == pytest.approx(0.01 * 0.92) and noise.seeds == 3


def test_a_checkpoint_only_some_seeds_reached_gets_no_band():
    """The last checkpoint of 2 of an arm's 8 seeds: its mean is drawn, its band (a 1-df t-interval
    spanning most of the axis, and not over the 8 seeds the legend names) is not."""
    curves = pd.DataFrame(
        {
            "arm": ["a", "a", "a", "b"],
            "time_s": [0.0, 10.0, 12.0, 10.0],
            "mean": [0.2, 0.3, 0.35, 0.3],
            "ci_low": [0.2, 0.28, 0.05, 0.27],
            "ci_high": [0.2, 0.32, 0.62, 0.33],
            "n_seeds": [8, 8, 2, 3],
        }
    )
    banded = without_partial_bands(curves)
    assert banded["ci_low"].isna().tolist() == [False, False, True, False]
    assert banded["ci_high"].isna().tolist() == [False, False, True, False]
    assert banded["mean"].tolist() == curves["mean"].tolist()


def test_a_single_seed_gives_numbers_without_intervals(tmp_path, capsys):
    root = tmp_path / "results" / "one-seed"
    for arm in CURVES:
        write_run(root, arm, seed=1)
    assert main(["aggregate", str(root), "--out", str(tmp_path / "results"), "--bootstrap", "100"]) == 0
    speedups = pd.read_csv(root / "summary" / "speedups.csv").set_index("arm")
    assert speedups.loc["pods", "speedup"] == pytest.approx(2.0) and speedups.loc["pods", "n_bootstrap"] == 0
    assert speedups[["speedup_ci_low", "peak_ci_low"]].isna().all().all()
    assert "No CIs" in (root / "summary" / "speedups.md").read_text()
    assert main(["plot", str(root), "--out", str(tmp_path / "figures")]) == 0
    assert (tmp_path / "figures" / "one-seed" / "accuracy.png").stat().st_size > 10_000


def test_a_seed_missing_a_checkpoint_is_flagged(experiment):
    eval_path = experiment / "runs" / "grpo" / "seed2" / "eval.jsonl"
    lines = eval_path.read_text().splitlines(keepends=True)
    eval_path.write_text("".join(lines[:2] + lines[3:]))  # its evaluation at ~20 s is lost
    _, warnings = load_experiments(experiment, progress=False)
    assert len(warnings) == 1 and warnings[0].startswith("arm grpo: the seeds' k-th checkpoints differ by up to 10")


def test_a_truncated_last_line_is_dropped_with_a_warning(experiment):
    eval_path = experiment / "runs" / "pods" / "seed1" / "eval.jsonl"
    with open(eval_path, "a") as f:
        f.write('{"checkpoint": "step-000200", "step": 2')  # a crash in the middle of a line
    (exp,), warnings = load_experiments(experiment, progress=False)
    assert warnings == [f"{eval_path}: dropped a truncated last line"]
    assert len(exp.evals[(exp.evals["arm"] == "pods") & (exp.evals["seed"] == 1)]) == 6 * 4


def test_broken_runs_are_skipped_and_the_others_load(experiment, capsys):
    broken = experiment / "runs" / "pods" / "seed1" / "eval.jsonl"
    lines = broken.read_text().splitlines()
    broken.write_text("\n".join(lines[:2] + ["{not json"] + lines[2:]) + "\n")
    (experiment / "runs" / "grpo" / "seed2" / "eval.jsonl").write_text("")
    (exp,), warnings = load_experiments(experiment, progress=False)
    assert len(warnings) == 2
    assert f"{broken}: line 3 is not valid JSON" in warnings[0] + warnings[1]
    assert any("seed2: skipped (eval.jsonl is empty)" in w for w in warnings)
    assert exp.evals.groupby("arm")["seed"].nunique().to_dict() == {"grpo": 2, "pods": 2}
    # through the command: warnings on stderr, results still written
    assert main(["aggregate", str(experiment), "--out", str(experiment.parent), "--bootstrap", "0"]) == 0
    err = capsys.readouterr().err
    assert err.count("pods-bench: warning: ") == 2 and "Traceback" not in err


def test_an_unknown_baseline_is_a_one_line_error(experiment, capsys):
    assert main(["aggregate", str(experiment), "--baseline", "ppo", "--bootstrap", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "pods-bench: error: smoke-equal-rollouts: no arm named 'ppo' (arms: grpo, pods)"


def test_nothing_loadable_exits_2_with_one_stderr_line(tmp_path):
    folder = tmp_path / "results" / "broken"
    (folder / "runs" / "grpo" / "seed0").mkdir(parents=True)
    (folder / "runs" / "grpo" / "seed0" / "run.json").write_text("{}")
    (folder / "runs" / "grpo" / "seed0" / "eval.jsonl").write_text('{"step": 0}\n{"step"\n')
    result = subprocess.run(
        [sys.executable, "-m", "pods_bench.cli", "aggregate", str(folder), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pods-bench: error: ") and "Traceback" not in result.stderr
    assert "eval.jsonl: line 2 is not valid JSON" in lines[0]


# --- the baseline's peak, on hand-made curves ---------------------------------------------------------


def hand_curve(arm: str, values: list[float]):
    """One seed's curve on the checkpoint grid 0, 1, 2, 3 s."""
    import numpy as np

    from pods_bench.analysis.speedup import ArmCurves

    return ArmCurves(arm, np.array([0.0, 1.0, 2.0, 3.0]), np.array([values]))


def test_the_peaks_are_taken_after_the_start_and_the_threshold_from_the_baselines():
    """max over t > 0 only: a start above everything later (0.9 at t = 0) is not the peak, and the first
    checkpoint after it (t = 1) is. Baseline 0.6 at t = 1: T = 0.99 x 0.6 = 0.594, reached at t = 1 by
    both; the arm's peak is its 0.7 at t = 1."""
    import numpy as np

    from pods_bench.analysis.speedup import pair_statistics

    base = hand_curve("grpo", [0.9, 0.6, 0.5, 0.55])
    arm = hand_curve("pods", [0.9, 0.7, 0.59, 0.65])
    s = pair_statistics(base, base.curve()[None], arm, arm.curve()[None], q=0.99, gain_fractions=())
    assert float(s["peak_base"][0]) == pytest.approx(0.6)
    assert float(s["threshold"][0]) == pytest.approx(0.594)
    assert float(s["peak_arm"][0]) == pytest.approx(0.7)
    assert (float(s["t_base"][0]), float(s["t_arm"][0]), float(s["speedup"][0])) == (1.0, 1.0, 1.0)
    assert np.isfinite(s["t_base"]).all()


@pytest.mark.parametrize(
    "values, rising",
    [
        ([0.1, 0.2, 0.3, 0.5], True),  # highest at the last checkpoint: still improving
        ([0.9, 0.2, 0.3, 0.5], True),  # a higher start does not count: after it, the last is highest
        ([0.1, 0.6, 0.3, 0.5], False),  # peaked at t = 1 and fell back
        ([0.1, 0.5, 0.3, 0.5], False),  # the peak was first reached at t = 1: level since, not rising
    ],
)
def test_the_baseline_is_still_rising_when_its_peak_after_the_start_is_its_last_checkpoint(values, rising):
    from pods_bench.analysis.speedup import baseline_still_rising

    assert baseline_still_rising(hand_curve("grpo", values)) is rising


# --- the formatting of the tables and the caption, value by value --------------------------------


def _speedup_row(value=2.0, bound="", low=1.5, high=2.5, baseline=False, column="speedup"):
    return pd.Series(
        {column: value, f"{column}_bound": bound, f"{column}_ci_low": low, f"{column}_ci_high": high,
         "is_baseline": baseline}
    )  # fmt: skip


def test_a_speedup_is_printed_with_its_bound_and_interval():
    from pods_bench.analysis.tables import format_speedup

    assert format_speedup(_speedup_row()) == "2.00x [1.50, 2.50]"
    assert format_speedup(_speedup_row(bound="<")) == "<2.00x [1.50, 2.50]"  # the arm never reached T
    assert format_speedup(_speedup_row(bound=">="), latex=True) == "$\\geq$2.00x [1.50, 2.50]"
    assert format_speedup(_speedup_row(bound="<"), latex=True) == "$<$2.00x [1.50, 2.50]"
    assert format_speedup(_speedup_row(bound=">=")) == ">=2.00x [1.50, 2.50]"
    assert format_speedup(_speedup_row(), with_ci=False) == "2.00x"
    assert format_speedup(_speedup_row(value=1.0, baseline=True)) == "1.00x"  # the baseline has no interval
    assert format_speedup(_speedup_row(low=float("nan"), high=float("nan"))) == "2.00x"  # one seed: no CI
    assert format_speedup(_speedup_row(bound="n/a")) == "n/a"
    assert format_speedup(_speedup_row(value=float("nan"))) == "n/a"
    row = _speedup_row(value=1.234, low=1.0, high=1.5, column="speedup_interp")
    assert format_speedup(row, "speedup_interp") == "1.23x [1.00, 1.50]"


def test_counts_times_and_intervals_are_printed_in_their_units():
    from types import SimpleNamespace

    from pods_bench.analysis.tables import _ci, format_count, format_time, time_unit

    assert _ci(0.1234, 0.5678, 1, 100) == " [12.3, 56.8]" and _ci(1.234, 2.0, 2) == " [1.23, 2.00]"
    assert _ci(float("nan"), 0.5, 1) == ""
    assert [format_count(v) for v in (1234.4, 999_999.4, 1e6, 2.5e7)] == ["1,234", "999,999", "1e+06", "2.5e+07"]
    assert format_count(float("inf")) == "never" and format_count(float("nan")) == "never"
    assert format_time(90.0, "min") == "1.5 min" and format_time(7200.0, "h") == "2 h"
    assert format_time(12.345, "s") == "12.3 s" and format_time(float("inf"), "s") == "never"
    # the unit follows the budget: hours from 3 h, minutes from 5 min; an experiment's own unit wins
    plain = SimpleNamespace(time_unit=None)
    budgets = [3 * 3600, 3 * 3600 - 1, 5 * 60, 5 * 60 - 1]
    assert [time_unit(plain, b) for b in budgets] == ["h", "min", "min", "s"]
    assert time_unit(SimpleNamespace(time_unit="h"), 10.0) == "h"


def test_the_caption_says_how_a_calibrated_budget_was_set():
    from pods_bench.analysis.tables import _calibrated

    c = {
        "arm": "grpo", "steps": 40, "untimed_steps": 2, "timed_steps": 2, "side_by_side": 2,
        "seconds_per_step": 2.5, "budget_s": 100.0, "checkpoint_every_s": 12.5, "cap_s": None, "capped": False,
    }  # fmt: skip
    assert _calibrated(c) == (
        "; set as 40 steps of grpo at 2.50 s/step, timed here before the runs (median of 2 steps of 2 runs side "
        "by side, as the arms train): 100.0 s of training clock for every arm (a run stops after the step that "
        "passes it), a checkpoint every 12.50 s"
    )
    capped = c | {"budget_s": 50.0, "checkpoint_every_s": 6.25, "cap_s": 50, "capped": True}
    assert _calibrated(capped).endswith(": 50.0 s of training clock for every arm (a run stops after the step that "
                                        "passes it), a checkpoint every 6.25 s, capped at 50 s")  # fmt: skip
    # a calibration recorded before untimed steps and side-by-side runs: the mean of one run's steps
    old = {k: v for k, v in c.items() if k not in ("untimed_steps", "side_by_side")} | {"timed_steps": 1}
    assert "(mean of 1 step): " in _calibrated(old)
    assert "(median of 2 steps): " in _calibrated(c | {"side_by_side": 1})
    assert _calibrated(None) == "" and _calibrated({}) == ""


def test_the_verdict_words_each_bound_and_the_seed_count(tmp_path):
    """The noisy experiment's summary (pods 2.00x sooner, 1.83x to 80 % of the gain, 3 seeds, no
    resampling so no intervals; 200 problems: no noise clause), its pods row marked in turn as a lower
    bound, an upper bound, not reached, and resting on 1 or 2 seeds."""
    from pods_bench.analysis.tables import AnalysisOptions, summarize, verdict_lines

    root = tmp_path / "results" / "noisy"
    for arm in CURVES:
        for seed in JITTER:
            write_run(root, arm, seed)
    (exp,), _ = load_experiments(root, progress=False)
    summary = summarize(exp, AnalysisOptions(n_bootstrap=0), progress=False)
    s = summary.speedups
    pods = s.index[s["arm"] == "pods"][0]
    gain = "; to 80 % of grpo's gain 1.83x."
    assert verdict_lines(summary) == ["pods reached 0.99 x grpo's peak 2.00x sooner over 3 seeds" + gain]
    s.loc[pods, "speedup_bound"] = ">="
    assert verdict_lines(summary) == [
        "pods reached 0.99 x grpo's peak at least 2.00x sooner over 3 seeds (grpo peaked at its last checkpoint: "
        "a lower bound)" + gain
    ]
    s.loc[pods, "speedup_bound"] = "<"
    assert verdict_lines(summary) == ["pods reached 0.99 x grpo's peak at most 2.00x sooner over 3 seeds" + gain]
    s.loc[pods, "speedup_bound"] = "n/a"
    assert verdict_lines(summary) == ["pods did not reach 0.99 x grpo's peak within the budget (over 3 seeds)" + gain]
    s.loc[pods, "speedup_bound"] = ""
    for seeds, words in ((1, "over 1 seed;"), (2, "over 2 seeds;")):
        s.loc[pods, "n_seeds"] = seeds
        assert words in verdict_lines(summary)[0]
    # the table's cells for the same rows: bounds in LaTeX, an arm that never reached T, s/step
    from pods_bench.analysis.tables import _display_table

    s.loc[pods, ["n_seeds", "speedup_bound", "speedup_interp_bound"]] = [3, ">=", "<"]
    s.loc[pods, ["t_arm_s", "t_arm_last_s", "seconds_per_step"]] = [float("inf"), 50.0, 1.2345]
    latex = _display_table(summary, latex=True).set_index("Arm").loc["pods"]
    assert (latex["Peak (\\%)"], latex["Speedup"], latex["Speedup (interp.)"]) == ("90.0", "$\\geq$2.00x", "$<$1.98x")
    assert latex["Speedup to 80\\% of gain"] == "1.83x" and latex["Time to T"] == "> 50 s"
    assert latex["s/step"] == "1.23"
    plain = _display_table(summary, latex=False).set_index("Arm").loc["pods"]
    assert (plain["Speedup"], plain["Speedup (interp.)"], plain["Speedup to 80% of gain"]) == (
        ">=2.00x",
        "<1.98x",
        "1.83x",
    )
    s.loc[pods, "seconds_per_step"] = float("nan")
    assert _display_table(summary, latex=False).set_index("Arm").loc["pods", "s/step"] == ""
