"""Importer for the paper's published logs: the real subset in the shared data folder (the paper's
2.00x and 1.71x), synthetic files in every other published format, and bad files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pods_bench.analysis.figures import arm_families
from pods_bench.analysis.load import load_experiments
from pods_bench.analysis.paper_logs import infer_sample_count
from pods_bench.analysis.speedup import compare_arms
from pods_bench.cli import main
from pods_bench.errors import PodsBenchError

SIZES = {"gsm8k": 1319, "math500": 500, "amc23": 40}


@pytest.fixture(scope="module")
def logs(data_dir) -> Path:
    return data_dir / "pods-paper-logs"


@pytest.fixture(scope="module")
def published(logs):
    experiments, warnings = load_experiments(logs, progress=False)
    assert warnings == []
    return {e.name: e for e in experiments}


def speedup_row(exp, n_bootstrap=0):
    baseline, benchmark, metric = exp.resolve(None, "gsm8k", "answer_acc")
    rows = compare_arms(exp, baseline, benchmark, metric, n_bootstrap=n_bootstrap, seed=0, progress=False)
    return rows[~rows["is_baseline"]].iloc[0]


def test_published_gsm8k_l40s_speedup_is_2x(published):
    exp = published["gsm8k-l40s-qwen"]
    assert exp.arm_names == ["GRPO", "PODS n=64 m=16"] and exp.hardware == "one L40S"
    row = speedup_row(exp)
    assert round(row["threshold"] * 100, 2) == 80.82
    assert (row["t_baseline_s"], row["t_arm_s"]) == (3 * 3600, 1.5 * 3600)
    assert round(row["speedup"], 2) == 2.00 and row["speedup_bound"] == ""


def test_published_h100_speedup_is_1_71x(published):
    exp = published["h100-gsm8k"]
    assert exp.arm_names == ["GRPO", "PODS n=128 m=32"] and exp.hardware == "8×H100"
    row = speedup_row(exp)
    assert round(row["threshold"] * 100, 2) == 81.73
    assert (row["t_baseline_s"], row["t_arm_s"]) == (24 * 60, 14 * 60)
    assert round(row["speedup"], 2) == 1.71


def test_published_speedups_have_bootstrap_intervals_around_them(published):
    for name in ("gsm8k-l40s-qwen", "h100-gsm8k"):
        row = speedup_row(published[name], n_bootstrap=300)
        assert row["speedup_ci_low"] <= row["speedup"] <= row["speedup_ci_high"]
        assert row["speedup_ci_low"] < row["speedup_ci_high"]


def test_published_logs_become_the_tidy_table(published):
    qwen = published["gsm8k-l40s-qwen"].evals
    assert set(qwen["seed"]) == set(range(1, 11))
    assert sorted(qwen["time_s"].unique()) == [1800.0 * i for i in range(13)]  # base model + 12 checkpoints
    gsm8k = qwen[(qwen["benchmark"] == "gsm8k") & (qwen["metric"] == "answer_acc")]
    assert (gsm8k["n_repeats"] == 5).all() and (gsm8k["n_problems"] == 1319).all()
    h100 = published["h100-gsm8k"].evals
    assert sorted(h100["time_s"].unique()) == [120.0 * i for i in range(16)]
    assert set(h100["metric"]) == {"answer_acc", "mean_length"}
    assert (h100["raw_time_s"] - h100["time_s"]).abs().max() < 120  # nearest evaluation to each grid time
    steps = published["h100-gsm8k"].step_times.groupby("arm")["seconds_per_step"].mean()
    assert steps["PODS n=128 m=32"] < steps["GRPO"]  # per optimizer step, as in the paper's bar chart


def test_sample_count_is_recovered_from_the_accuracies():
    assert infer_sample_count([319 / 1319, 1000 / 1319, 1]) == 1319
    assert infer_sample_count([51 / 2048, 0.5]) == 2048
    assert infer_sample_count([]) is None


# --- every published format, synthetic -----------------------------------------------------------


def single_gpu_log(curve: list[float], steps_per_checkpoint: int, rng) -> dict:
    """A run file in the published layout: checkpoint-<step> -> benchmark -> 5 repeats per metric."""
    log = {}
    for i, acc in enumerate(curve, start=1):
        block = {}
        for bench, n in SIZES.items():
            ans = [round(float(np.clip(acc + rng.normal(0, 0.01), 0, 1)) * n) / n for _ in range(5)]
            block[bench] = {
                "ans_acc": ans,
                "for_acc": [0.9] * 5,
                "both_acc": [a * 0.9 for a in ans],
                "lengths": [200.0 + i] * 5,
                "examples": [{"prompt": "q", "completion": "a"}],
            }
        log[f"checkpoint-{i * steps_per_checkpoint}"] = block
    return log


def write_export(path: Path, runs: dict[str, list[float]], key: str):
    """A tracker export: one row per evaluation event of one run, every 2 minutes at run-specific times."""
    rows = []
    for r, (run, values) in enumerate(runs.items()):
        for i, v in enumerate(values):
            row = {"eval/time": 60.0 + 120.0 * i + r}
            row[f"data/{run} - _step"], row[f"data/{run} - {key}"] = 10 * (i + 1), v
            row[f"data/{run} - {key}__MIN"] = v
            rows.append(row)
    pd.DataFrame(rows).sort_values("eval/time").to_csv(path, index=False)


@pytest.fixture(scope="module")
def full_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("published") / "results"
    folder.mkdir()
    rng = np.random.default_rng(0)
    rising = [
        0.70,
        0.75,
        0.78,
        0.80,
        0.81,
        0.81,
        0.81,
        0.81,
        0.81,
        0.81,
        0.81,
        0.81,
        0.81,
        0.81,
    ]  # 14 > 12 checkpoints
    for name, shift in [
        ("GSM8K-512-16-16", -0.02),
        ("GSM8K-512-64-16", 0.0),
        ("GSM8K-512-64-8", -0.01),
        ("GSM8K-MaxR-512-64-16", -0.03),
        ("GSM8K-Rand-512-64-16", -0.015),
        ("GSM8K-512-256-16", 0.0),
        ("MATH-NF-512-8-8", -0.4),
        ("MATH-NF-512-32-8", -0.38),
        ("Llama-512-16-16-0.04", -0.1),
        ("Llama-512-64-16-0.04", -0.08),
        ("GSM8K-512-64-16-1e-5", 0.0),
    ]:
        for seed in (1, 2):
            log = single_gpu_log([a + shift for a in rising], 100, rng)
            (folder / f"Instruct-{name}-Run{seed}.json").write_text(json.dumps(log))
    for base in ("base-qwen.json", "base-llama.json"):
        (folder / base).write_text(json.dumps(single_gpu_log([0.5], 0, rng)["checkpoint-0"]))
    for prefix, family in (("a100s", "GR7B"), ("h100s", "GRPO")):
        runs = {
            f"{family}-s{s}-p8-n{n}-m32-ga{ga}": [min(0.85, 0.05 * (i + 1) * (n / 32) ** 0.5) for i in range(20)]
            for s in (1, 2)
            for n, ga in ((32, 16), (128, 4))
        }
        write_export(folder / f"{prefix}-acc.csv", runs, "eval/rewards/accuracy_reward/mean")
        write_export(folder / f"{prefix}-length.csv", {k: [300.0] * 20 for k in runs}, "eval/completions/mean_length")
    return folder.parent


@pytest.fixture(scope="module")
def full(full_folder):
    return load_experiments(full_folder, progress=False)


def test_every_published_setting_and_format_loads(full):
    experiments, warnings = full
    assert warnings == []
    by_name = {e.name: e for e in experiments}
    assert sorted(by_name) == [
        "a100-gsm8k",
        "gsm8k-l40s-llama",
        "gsm8k-l40s-qwen",
        "gsm8k-l40s-qwen-1e-5",
        "h100-gsm8k",
        "math-l40s-qwen",
    ]
    qwen = by_name["gsm8k-l40s-qwen"]
    assert qwen.arm_names == [
        "GRPO",
        "PODS n=64 m=16",
        "PODS n=64 m=8",
        "PODS n=256 m=16",
        "PODS-MaxR n=64 m=16",
        "PODS-Rand n=64 m=16",
    ]
    assert dict(zip(qwen.arms["arm"], qwen.arms["rule"]))["PODS-Rand n=64 m=16"] == "random"
    assert qwen.evals["time_s"].max() == 6 * 3600  # checkpoints past the 6 h budget are left out
    llama = by_name["gsm8k-l40s-llama"]
    assert (llama.default_metric, llama.time_unit) == ("both_acc", "min")
    assert sorted(llama.evals["time_s"].unique()) == [600.0 * i for i in range(10)]  # 10-minute checkpoints, 1.5 h
    assert llama.evals[llama.evals["time_s"] == 0]["value"].notna().all()  # base-llama.json is time 0
    assert by_name["math-l40s-qwen"].default_benchmark == "math500"
    a100 = by_name["a100-gsm8k"]
    assert a100.hardware == "8×A100" and a100.arm_names == ["GRPO", "PODS n=128 m=32"]
    assert set(a100.evals["seed"]) == {1, 2}
    for exp in experiments:  # every setting gives a speedup row
        baseline, benchmark, metric = exp.resolve(None, None, None)
        rows = compare_arms(exp, baseline, benchmark, metric, n_bootstrap=0, progress=False)
        assert len(rows) == len(exp.arm_names) and rows["speedup"].notna().all()


def test_arm_families_of_the_gsm8k_ablations(full):
    qwen = next(e for e in full[0] if e.name == "gsm8k-l40s-qwen")
    families = arm_families(qwen.arms, "GRPO")
    assert families == {
        "n-scaling": ["GRPO", "PODS n=64 m=16", "PODS n=256 m=16"],
        "m-scaling": ["GRPO", "PODS n=64 m=16", "PODS n=64 m=8"],
        "rule": ["GRPO", "PODS n=64 m=16", "PODS-MaxR n=64 m=16", "PODS-Rand n=64 m=16"],
    }


def test_multi_gpu_runs_without_all_of_accuracy_step_and_length_are_dropped(tmp_path):
    # as the paper's plot scripts (seeds with accuracy & _step & length); the A100 export has such runs
    folder = tmp_path / "results"
    folder.mkdir()
    runs = {
        f"GR7B-s{s}-p8-n{n}-m32-ga{ga}": [min(0.85, 0.05 * (i + 1) * (n / 32) ** 0.5) for i in range(20)]
        for s in (1, 2, 3)
        for n, ga in ((32, 16), (128, 4))
    }
    no_length, no_acc, no_length_step = "GR7B-s2-p8-n32-m32-ga16", "GR7B-s3-p8-n32-m32-ga16", "GR7B-s1-p8-n128-m32-ga4"
    write_export(
        folder / "a100s-acc.csv", {k: v for k, v in runs.items() if k != no_acc}, "eval/rewards/accuracy_reward/mean"
    )
    write_export(
        folder / "a100s-length.csv", {k: [300.0] * 20 for k in runs if k != no_length}, "eval/completions/mean_length"
    )
    length = pd.read_csv(folder / "a100s-length.csv")
    length.drop(columns=[f"data/{no_length_step} - _step"]).to_csv(folder / "a100s-length.csv", index=False)
    experiments, warnings = load_experiments(tmp_path, progress=False)
    evals = experiments[0].evals
    assert sorted(evals[evals["arm"] == "GRPO"]["seed"].unique()) == [1]
    assert sorted(evals[evals["arm"] == "PODS n=128 m=32"]["seed"].unique()) == [1, 2, 3]
    assert len(warnings) == 2
    assert f"run {no_length} skipped (no eval/completions/mean_length in a100s-length.csv;" in warnings[0]
    assert (
        f"run {no_acc} skipped (no eval/rewards/accuracy_reward/mean in a100s-acc.csv, "
        "no _step in a100s-acc.csv;" in warnings[1]
    )
    # the length file's own _step is not needed: those rows take the accuracy file's steps
    kept = evals[evals["seed"] == 1].set_index(["arm", "metric", "time_s"])["step"]
    assert kept.loc["PODS n=128 m=32", "mean_length"].equals(kept.loc["PODS n=128 m=32", "answer_acc"])


# --- bad input ----------------------------------------------------------------------------------


def test_bad_files_are_skipped_with_a_warning_naming_them(logs, tmp_path):
    folder = tmp_path / "results"
    shutil.copytree(logs / "results", folder)
    (folder / "Instruct-GSM8K-fast-Run1.json").write_text("{}")
    (folder / "Instruct-GSM8K-512-64-16-Run11.json").write_text("{}")
    (folder / "Instruct-GSM8K-512-64-16-Run12.json").write_text('{"checkpoint-10": ')
    pd.read_csv(folder / "h100s-acc.csv").drop(columns=["eval/time"]).to_csv(folder / "a100s-acc.csv", index=False)
    experiments, warnings = load_experiments(tmp_path, progress=False)
    assert sorted(e.name for e in experiments) == ["gsm8k-l40s-qwen", "h100-gsm8k"]
    text = "\n".join(warnings)
    assert len(warnings) == 4
    assert "Instruct-GSM8K-fast-Run1.json: skipped (file name does not follow" in text
    assert "Instruct-GSM8K-512-64-16-Run11.json: skipped (no checkpoints in the file)" in text
    assert "Instruct-GSM8K-512-64-16-Run12.json: skipped (not valid JSON" in text
    assert "a100s-acc.csv: skipped (no 'eval/time' column)" in text
    qwen = next(e for e in experiments if e.name == "gsm8k-l40s-qwen")
    assert set(qwen.evals["seed"]) == set(range(1, 11))  # the good runs all loaded


def test_nothing_loadable_is_one_error_line_through_the_cli(tmp_path, capsys):
    (tmp_path / "h100s-acc.csv").write_text("time,acc\n1,0.5\n")
    with pytest.raises(PodsBenchError, match=r"nothing could be loaded: .*h100s-acc.csv: skipped \(no 'eval/time'"):
        load_experiments(tmp_path, progress=False)
    assert main(["aggregate", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pods-bench: error: ") and "h100s-acc.csv" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "out").exists()
