"""Verdicts per warm start (pods_bench/analysis/robustness.py) on hand-made runs whose times to 80 % of
GRPO's gain are worked out here by hand, and the start each own run records (run.json's model.name)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from pods_bench.analysis.load import load_experiments
from pods_bench.analysis.robustness import robustness_markdown, robustness_table, starts_of
from pods_bench.analysis.speedup import compare_arms
from pods_bench.analysis.tidy import START_COLUMNS, Results
from tests.test_analysis_speedup import make_experiment

GRID = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
# GRPO: start 0.2, peak 1.0, so 80 % of its gain is 0.84, crossed between 30 s (0.8) and 40 s (1.0)
# at 30 + 0.04 / 0.2 x 10 = 32 s; it peaks before its last checkpoint, so nothing is censored
GRPO = [0.2, 0.4, 0.6, 0.8, 1.0, 0.9]
FAST = [0.2, 1.0, 1.0, 1.0, 1.0, 1.0]  # crosses 0.84 at 0.64 / 0.8 x 10 = 8 s: 32 / 8 = 4x
FLAT = [0.2] * 6  # never gets there
A, B = "results/warm_start/arith-tiny", "results/warm_start/arith-tiny-seed1"


def start_of(seed: int) -> str:
    return A if seed % 2 == 0 else B  # as warm_start.seeds [0, 1] assigns run seeds


def experiment(curves: dict[str, dict[str, list[float]]], seeds=range(8)) -> Results:
    """arm -> start -> the accuracy at each checkpoint of GRID of every run seed from that start."""
    exp = make_experiment(
        {arm: [by_start[start_of(k)] for k in seeds] for arm, by_start in curves.items()}, times=np.array(GRID)
    )
    # make_experiment numbers the runs 0, 1, ...: run i is seed seeds[i]
    starts = [dict(arm=arm, seed=i, start=start_of(k)) for arm in curves for i, k in enumerate(seeds)]
    return replace(exp, starts=pd.DataFrame(starts, columns=START_COLUMNS))


CURVES = {
    "grpo": {A: GRPO, B: GRPO},
    "steady": {A: FAST, B: FAST},  # 4x sooner from both starts: the conclusion holds
    "flips": {A: FAST, B: GRPO},  # 4x sooner from one start, no sooner from the other: it does not
    "never": {A: FLAT, B: FLAT},  # never reaches the level from either: slower on both
    "reverses": {A: FAST, B: FLAT},  # faster from one start, slower from the other: contradicted
    "same": {A: GRPO, B: GRPO},  # no sooner from either: unclear on both, no conclusion to hold
}


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    exp = experiment(CURVES)
    return robustness_table(exp, compare_arms(exp, "grpo", "arith", "answer_acc", n_bootstrap=999), n_bootstrap=999)


def row(table: pd.DataFrame, arm: str, start: str) -> pd.Series:
    return table[(table["arm"] == arm) & (table["start"] == start)].iloc[0]


def test_each_start_is_compared_on_its_own_seeds():
    assert starts_of(experiment(CURVES)) == {A: [0, 2, 4, 6], B: [1, 3, 5, 7]}


def test_the_verdicts_on_each_start_and_whether_they_hold(table):
    assert row(table, "steady", A)["speedup"] == pytest.approx(4.0)
    assert row(table, "steady", B)["speedup"] == pytest.approx(4.0)
    assert [row(table, "steady", s)["verdict"] for s in (A, B)] == ["faster", "faster"]
    assert row(table, "flips", A)["speedup"] == pytest.approx(4.0)
    assert row(table, "flips", B)["speedup"] == pytest.approx(1.0)  # the interval [1, 1] contains 1
    assert [row(table, "flips", s)["verdict"] for s in (A, B)] == ["faster", "unclear"]
    assert [row(table, "never", s)["verdict"] for s in (A, B)] == ["slower", "slower"]
    holds = table.drop_duplicates("arm").set_index("arm")["holds"]
    assert holds.to_dict() == {
        "grpo": True,
        "steady": True,
        "flips": False,
        "never": True,
        "reverses": False,
        "same": False,
    }
    agreement = table.drop_duplicates("arm").set_index("arm")["agreement"]
    assert agreement.to_dict() == {
        "grpo": "holds",
        "steady": "holds",
        "flips": "partly",
        "never": "holds",
        "reverses": "contradicted",
        "same": "unclear",
    }
    assert set(table["n_seeds"]) == {4, 8}


def test_all_runs_together_are_the_pooled_row(table):
    # the 8 seeds' mean curve of `flips`: 0.7 at 10 s, 0.8 at 20 s, 0.9 at 30 s, so 0.84 at 24 s: 32 / 24
    pooled = row(table, "flips", "all")
    assert (pooled["n_seeds"], pooled["seeds"]) == (8, "0 1 2 3 4 5 6 7")
    assert pooled["speedup"] == pytest.approx(32 / 24)


def test_the_markdown_has_a_line_per_arm_with_its_verdicts(table):
    text = robustness_markdown(table, "grpo")
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "grpo" not in lines  # the baseline has no verdict
    assert lines["steady"].endswith("| **yes**: faster |") and "faster: 4.00x [4.00, 4.00]" in lines["steady"]
    assert lines["flips"].endswith("| no: unclear on some |") and "unclear: 1.00x" in lines["flips"]
    assert lines["reverses"].endswith("| no: **contradicted** |")
    assert lines["same"].endswith("| no: unclear on every start |")
    assert lines["never"].endswith("| **yes**: slower |")
    assert f"| arm | {A} (seeds 0 2 4 6) | {B} (seeds 1 3 5 7) | all runs | holds on every start |" in text


def test_one_start_gives_no_rows_and_says_so():
    one = experiment({"grpo": {A: GRPO, B: GRPO}, "steady": {A: FAST, B: FAST}}, seeds=[0, 2])
    table = robustness_table(one, compare_arms(one, "grpo", "arith", "answer_acc", n_bootstrap=99), n_bootstrap=99)
    assert table.empty
    assert "nothing to compare (set `warm_start.seeds`)" in robustness_markdown(table, "grpo")


def test_own_runs_record_the_model_they_started_from(tmp_path):
    from tests.test_analysis_runs import write_run

    for seed in (0, 1):
        folder = write_run(tmp_path / "exp", "grpo", seed)
        record = json.loads((folder / "run.json").read_text())
        record["config"]["model"] = {"name": start_of(seed)}
        (folder / "run.json").write_text(json.dumps(record))
    [exp], _ = load_experiments(tmp_path / "exp", kind="runs", progress=False)
    assert exp.starts.sort_values("seed").to_dict("records") == [
        dict(arm="grpo", seed=0, start=A),
        dict(arm="grpo", seed=1, start=B),
    ]
    assert sorted(exp.with_seeds([1]).evals["seed"].unique()) == [1]
