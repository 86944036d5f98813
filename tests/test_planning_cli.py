"""`pods-bench profile` and `pods-bench project` run as a user runs them, checked against what the
other commands (`plan`, the train logs) say independently, not against their own arithmetic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.tiny_runs import read_lines

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("gen", "reward", "select", "update", "sync")


@pytest.fixture
def paper_logs(data_dir) -> Path:
    """The published logs in the data folder: a mis-set folder fails (the data fixture's rule), never skips."""
    logs = data_dir / "pods-paper-logs"
    if not logs.is_dir():
        pytest.fail(f"no published logs at {logs}; set PODS_BENCH_DATA_DIR to the data folder")
    return logs


def pods_bench(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pods_bench", *args], capture_output=True, text=True, timeout=900, cwd=cwd
    )


def plan_step_seconds(config: Path, hardware: str, out: Path, *extra: str) -> dict[str, float]:
    done = pods_bench("plan", str(config), "--hardware", hardware, "--out", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return dict(pd.read_csv(out)[["arm", "step_s"]].itertuples(index=False))


def test_project_scales_the_published_runs_by_the_plans_step_times(tmp_path, paper_logs):
    """Published L40S GSM8K runs onto one H200: each arm's projected s/step is what `plan` predicts
    for it on the H200, and the speedup moves by the ratio of the two arms' predicted/measured."""
    out = tmp_path / "projection.csv"
    done = pods_bench(
        "project", str(paper_logs), "--experiment", "gsm8k-l40s-qwen", "--config", "config/gsm8k_main.yaml",
        "--hardware", "h200", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "projection (not a measurement)" in done.stdout
    rows = pd.read_csv(out).set_index("n")
    plan = plan_step_seconds(ROOT / "config/gsm8k_main.yaml", "h200", tmp_path / "plan.csv")
    grpo, pods = rows.loc[16], rows.loc[64]
    assert grpo["projected_s_per_step"] == pytest.approx(plan["grpo_n16_m16"], abs=1e-3)
    assert pods["projected_s_per_step"] == pytest.approx(plan["pods_n64_m16"], abs=1e-3)
    r = lambda row, arm: plan[arm] / row["measured_s_per_step"]
    expected = pods["measured_speedup"] * r(grpo, "grpo_n16_m16") / r(pods, "pods_n64_m16")
    assert pods["projected_speedup"] == pytest.approx(expected, rel=1e-3)
    assert pods["projected_speedup"] != pytest.approx(pods["measured_speedup"], rel=1e-2)  # it did move


def test_project_leaves_out_arms_that_sample_in_rounds(tmp_path, paper_logs):
    """An arm whose allocation strategy samples in rounds has no predicted step: its row says so and
    carries no projection; a baseline like that stops the command with one line."""
    config = yaml.safe_load((ROOT / "config/gsm8k_main.yaml").read_text())
    config["train_base"] = str(ROOT / config["train_base"])
    config["arms"]["pods_n64_m16"]["set"] = {"allocation.strategy": "dynamic_sampling"}
    arm_in_rounds = tmp_path / "rounds.yaml"
    arm_in_rounds.write_text(yaml.safe_dump(config))
    args = ("project", str(paper_logs), "--experiment", "gsm8k-l40s-qwen", "--hardware", "h200")
    done = pods_bench(*args, "--config", str(arm_in_rounds), "--out", str(tmp_path / "p.csv"))
    assert done.returncode == 0, done.stderr
    pods = pd.read_csv(tmp_path / "p.csv").set_index("n").loc[64]
    assert pods["note"] == "not projected: allocation dynamic_sampling samples in rounds"
    assert pd.isna(pods["projected_s_per_step"]) and pd.isna(pods["projected_speedup"])

    config["arms"]["grpo_n16_m16"]["set"] = {"allocation.strategy": "dynamic_sampling"}
    baseline_in_rounds = tmp_path / "baseline.yaml"
    baseline_in_rounds.write_text(yaml.safe_dump(config))
    done = pods_bench(*args, "--config", str(baseline_in_rounds))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "the baseline" in done.stderr and "cannot be projected" in done.stderr


def tiny_experiment(tmp_path: Path) -> Path:
    """Three arms of the smoke task on a small untrained model, no warm start."""
    config = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())
    config["experiment"] = "profile_test"
    config["warm_start"] = {"enabled": False}
    config["budget_in_baseline_steps"] = None  # the baseline arm is renamed; profile sets its own budget
    config["arms"] = {
        "grpo_n4_m4": {"rule": "all", "n": 4, "m": 4},
        "pods_n8_m2": {"rule": "max_variance", "n": 8, "m": 2},
        "grpo_n8_m8": {"rule": "all", "n": 8, "m": 8},
    }
    config["train"] |= {
        "prompts_per_step": 2,
        "model": {"name": "tiny", "tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}},
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "reward": {"workers": 0},
    }
    path = tmp_path / "profile_test.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_profile_fits_on_some_arms_and_reports_the_others_as_the_plan_predicts_them(tmp_path):
    config, out = tiny_experiment(tmp_path), tmp_path / "profile"
    done = pods_bench("profile", str(config), "--fit", "grpo_n4_m4,pods_n8_m2", "--steps", "4", "--rounds", "2",
                      "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out / "validation.csv").set_index("arm")
    assert rows["role"].to_dict() == {"grpo_n4_m4": "fitted", "pods_n8_m2": "fitted", "grpo_n8_m8": "held out: n, m"}
    for arm, row in rows.iterrows():
        records = read_lines(out / "runs" / arm / "train_log.jsonl")
        assert len(records) == row["steps"] == 4  # two interleaved rounds of 2 steps
        measured = sum(sum(r[f"time_{p}_s"] for p in PHASES) for r in records) / len(records)
        assert row["measured_s"] == pytest.approx(measured, abs=1e-3)
    # the held-out arm's prediction is what `plan` says with the fitted model on this machine's setup
    plan = plan_step_seconds(config, "cpu", tmp_path / "plan.csv", "--model", str(out / "step_time_model.json"))
    assert rows.loc["grpo_n8_m8", "predicted_s"] == pytest.approx(plan["grpo_n8_m8"], rel=1e-3)
    assert "fitted on grpo_n4_m4, pods_n8_m2" in pd.read_csv(tmp_path / "plan.csv")["step_time_source"][0]
    # bad input: an arm to fit on that the config does not have
    done = pods_bench("profile", str(config), "--fit", "nope", "--out", str(tmp_path / "x"))
    assert done.returncode != 0 and "Traceback" not in done.stderr and "--fit: no arm 'nope'" in done.stderr
