"""The workflow end to end on CPU: a shortened smoke replication up to its HTML report, and the
allocation-strategies benchmark. Real jobs: pretraining, training, evaluation, aggregation, plots,
manifest. (The paper settings end to end, with a real model: tests/test_real_model.py.)"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pods_bench.io import read_jsonl
from tests.conftest import TEST_WARM_START, place_warm_start
from tests.test_workflow import CONFIG_DIR, snakemake

pytestmark = pytest.mark.slow

# The paper's GSM8K setting as configured, with a randomly initialised tiny model, one seed and one
# step: the SLURM test's GPU-setup job (tests/test_workflow_slurm.py). The paper settings run end to
# end with a real model in tests/test_real_model.py.
TINY_MODEL = {
    "hardware": "cpu",
    "seeds": [1],
    "train": {
        "model": {
            "name": "tiny",
            "dtype": "float32",
            "mixed_precision": "no",
            "gradient_checkpointing": False,
            "tiny": {"max_position_embeddings": 1024},
        },
        "engine": {"name": "hf"},  # vLLM's start-up alone would take longer than the whole run
        "sampling": {"max_new_tokens": 8},
        "reward": {"workers": 1},
        "budget": {"max_train_time_s": None, "max_steps": 1},
        "eval": {"n_problems": 2, "repeats": 2, "max_new_tokens": 8},
    },
    "resources": {"train": {"runtime_min": 10}},
}

# The smoke replication with two seeds, a short warm start and a few seconds of training per run.
SHORT_SMOKE = {
    "seeds": [0, 1],
    "warm_start": TEST_WARM_START,
    "budget_in_baseline_steps": {"steps": 3, "checkpoints": 2, "timed_steps": 1},
    "train": {
        "task": {"limit": 64},  # a training job renders 64 prompts, not the split's 20,000
        # the cap on the calibrated budget (3 steps: ~10 s here): a calibration timed beside other heavy
        # tests once measured 48 s a step, and four runs of that budget took the test from 4 to 10 minutes
        "budget": {"max_train_time_s": 30},
        "eval": {"n_problems": 20},
    },
}


def write_yaml(path, data):
    path.write_text(yaml.safe_dump(data))
    return str(path)


def check_success(out, experiment: str) -> None:
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert f"pods-bench: experiment {experiment} is complete." in out.stdout


def check_seeds_ran_side_by_side(runs: Path, arms: list[str], seeds: list[int], finished: str) -> None:
    """`pair_seeds`: the arms of a seed trained at the same time (each started before any ended), and
    no run of a seed started before every run of the seed before it was finished (its marker
    `finished`: eval.done after a separate evaluation job, train.done when evaluated inline)."""
    run = lambda arm, seed: json.loads((runs / arm / f"seed{seed}" / "run.json").read_text())
    when = lambda text: datetime.fromisoformat(text).timestamp()
    for at, seed in enumerate(seeds):
        started = [when(run(arm, seed)["started_at"]) for arm in arms]
        assert max(started) < min(when(run(arm, seed)["finished_at"]) for arm in arms), seed
        if at:
            done = max((runs / arm / f"seed{seeds[at - 1]}" / finished).stat().st_mtime for arm in arms)
            assert min(started) >= done - 1.0, seed  # started_at is kept to the second


def test_smoke_replication_end_to_end_with_its_report(tmp_path, data_dir, warm_start_seed0):
    configs = ["--configfile", str(CONFIG_DIR / "smoke.yaml"), write_yaml(tmp_path / "short.yaml", SHORT_SMOKE)]
    place_warm_start(warm_start_seed0, tmp_path)  # pretraining through the workflow: the strategies test
    out = snakemake(tmp_path, "--cores", "2", *configs, env={"PODS_BENCH_DATA_DIR": str(data_dir)}, timeout=900)
    check_success(out, "smoke")
    # progress: snakemake's own count and the trainer's bar (training clock, reward), both on the console
    assert "steps (100%) done" in out.stdout + out.stderr and "clock=" in out.stdout

    exp = tmp_path / "results" / "smoke"
    runs = sorted(p.relative_to(exp / "runs").as_posix() for p in (exp / "runs").glob("*/seed*"))
    assert runs == ["grpo_n16_m16/seed0", "grpo_n16_m16/seed1", "pods_n16_m8/seed0", "pods_n16_m8/seed1"]
    assert not (tmp_path / "results" / "warm_start" / "logs").exists()  # the warm start given was used
    # evaluated inside the training jobs (no evaluate job): every checkpoint has its records
    check_seeds_ran_side_by_side(exp / "runs", ["grpo_n16_m16", "pods_n16_m8"], [0, 1], finished="train.done")
    for run in runs:
        assert not (exp / "runs" / run / "eval.done").exists()
        checkpoints = {p.name for p in (exp / "runs" / run / "checkpoints").glob("step-*")}
        assert {r["checkpoint"] for r in read_jsonl(exp / "runs" / run / "eval.jsonl")} == checkpoints, run
        assert "step-000000" in checkpoints and len(checkpoints) >= 2, run
    speedups = pd.read_csv(exp / "summary" / "speedups.csv")
    assert set(speedups["arm"]) == {"grpo_n16_m16", "pods_n16_m8"}
    assert speedups.set_index("arm").loc["pods_n16_m8", "paired_seeds"]  # so the analysis pairs them
    # config/smoke.yaml fixes the MLPerf target (`make smoke-target`), so both arms have a row at it
    mlperf = pd.read_csv(exp / "summary" / "mlperf.csv")
    target = yaml.safe_load((CONFIG_DIR / "smoke.yaml").read_text())["analysis"]["target"]
    assert sorted(mlperf["arm"]) == ["grpo_n16_m16", "pods_n16_m8"]
    assert (mlperf["target"] == target).all() and (mlperf["n_runs"] == 2).all()
    # the budget: 3 of the baseline's steps timed here before the runs, the same seconds for every arm
    calibration = json.loads((exp / "calibration" / "calibration.json").read_text())
    # two training jobs at once on --cores 2: two timed runs side by side, one step timed in each
    # after two untimed ones
    assert (calibration["arm"], calibration["steps"], calibration["side_by_side"]) == ("grpo_n16_m16", 3, 2)
    assert [len(times) for times in calibration["step_times_s"]] == [1, 1] and calibration["untimed_steps"] == 2
    for run in runs:
        record = json.loads((exp / "runs" / run / "run.json").read_text())
        assert record["config"]["budget"]["max_train_time_s"] == pytest.approx(calibration["budget_s"])
        assert record["config"]["budget"]["checkpoint_every_s"] == pytest.approx(calibration["budget_s"] / 2)
        # timed with the threads the arms train with: one each, not the calibrate job's two
        assert calibration["torch_threads"] == [record["hardware"]["torch_threads"]] * 2 == [1, 1]
    manifest = yaml.safe_load((exp / "summary" / "manifest.yaml").read_text())
    assert manifest["calibration"] == calibration
    caption = (exp / "summary" / "speedups.md").read_text()  # the table's caption states how it was timed
    assert "3 steps of grpo_n16_m16 at" in caption and "(median of 1 step of 2 runs side by side" in caption
    # the verdict: printed at the end, and on the report's front page
    verdict = (exp / "summary" / "verdict.md").read_text().split("\n\n")[0].strip()
    assert verdict.startswith("pods_n16_m8 ") and "of grpo_n16_m16's gain" in verdict
    assert verdict in out.stdout
    figures = sorted(p.name for p in (tmp_path / "figures" / "smoke").glob("*.png"))
    assert figures

    report = snakemake(tmp_path, *configs, "--report", "results/smoke/report.html")
    assert report.returncode == 0, report.stderr[-4000:]
    html = (exp / "report.html").read_text()
    assert "of grpo_n16_m16" in html and "s gain" in html  # the verdict (HTML-escaped) on the front page
    for item in [*figures, "speedups.md", "curves.csv", "step_times.csv", "manifest.yaml"]:
        assert item in html, item


# The allocation-strategy benchmark with one seed, a short warm start and two steps per run.
SHORT_STRATEGIES = {
    "seeds": [0, 1],  # one from each of the two warm starts
    "warm_start": TEST_WARM_START,
    "train": {
        "budget": {"max_train_time_s": None, "max_steps": 2, "checkpoint_every_s": 3600},
        "eval": {"n_problems": 10},
    },
    "budget_in_baseline_steps": None,  # two steps, not seconds (the calibration: the smoke's test)
    "resources": {"train": {"runtime_min": 10}},
}


# Arms of config/strategies.yaml that the end-to-end run trains: the baseline and RAGEN-2's filter, a
# strategy whose batches are shorter than P and whose discarded groups the waste table counts. Every
# arm's config is resolved by the dry runs (tests/test_workflow.py); every strategy, groups of different
# sizes (VIGOR, HORA) and Pilot-Commit with a selection rule inside included, trains in
# tests/test_allocation_training.py, tests/test_results_format.py or tests/test_crash_resume.py (each
# arm reaches the trainer as the filter's does here: `--set allocation.strategy=...`).
STRATEGY_ARMS_RUN = ("grpo_n16_m16", "ragen_filter_n16_m16")


def test_strategies_benchmark_end_to_end(tmp_path, data_dir, warm_start_seed0):
    experiment = yaml.safe_load((CONFIG_DIR / "strategies.yaml").read_text())
    arms = {arm: experiment["arms"][arm] for arm in STRATEGY_ARMS_RUN}
    configs = [
        "--configfile",
        write_yaml(tmp_path / "strategies.yaml", {**experiment, "arms": arms}),
        write_yaml(tmp_path / "short.yaml", SHORT_STRATEGIES),
    ]
    # the first warm start as built once for the test run; the second (pretraining seed 1) is built
    # here by the workflow's warm_start rule
    place_warm_start(warm_start_seed0, tmp_path)
    out = snakemake(tmp_path, "--cores", "2", *configs, env={"PODS_BENCH_DATA_DIR": str(data_dir)}, timeout=1200)
    check_success(out, "strategies")
    assert [p.name for p in (tmp_path / "results" / "warm_start" / "logs").glob("*.log")] == [
        "arith-tiny-test-seed1.log"
    ]

    exp = tmp_path / "results" / "strategies"
    for arm, spec in arms.items():
        for seed in (0, 1):
            steps = read_jsonl(exp / "runs" / arm / f"seed{seed}" / "train_log.jsonl")
            strategy = spec.get("set", {}).get("allocation.strategy", "uniform")
            assert [r["step"] for r in steps] == [1, 2] and {r["allocation"] for r in steps} == {strategy}, arm
            # seed 1 started from the second warm start (pretraining seed 1)
            model = json.loads((exp / "runs" / arm / f"seed{seed}" / "run.json").read_text())["config"]["model"]
            assert model["name"] == "results/warm_start/arith-tiny-test" + "-seed1" * seed
    for folder, seed in (("arith-tiny-test", 0), ("arith-tiny-test-seed1", 1)):
        pretrain = json.loads((tmp_path / "results" / "warm_start" / folder / "pretrain.json").read_text())
        assert pretrain["settings"]["seed"] == seed
    # each arm's verdict on each warm start (one seed each, so no interval: unclear) and on both
    robustness = pd.read_csv(exp / "summary" / "robustness.csv")
    assert sorted(set(robustness["start"])) == [
        "all",
        "results/warm_start/arith-tiny-test",
        "results/warm_start/arith-tiny-test-seed1",
    ]
    assert set(robustness["arm"]) == set(arms) and len(robustness) == 3 * len(arms)
    assert "| arm | results/warm_start/arith-tiny-test (seeds 0) |" in (exp / "summary" / "robustness.md").read_text()
    cost = pd.read_csv(exp / "summary" / "cost.csv")
    assert set(cost["axis"]) == {"rollouts", "tokens", "flops"} and set(cost["arm"]) == set(arms)
    assert set(pd.read_csv(exp / "summary" / "speedups.csv")["arm"]) == set(arms)
    # the wasted work per arm: GRPO trains every rollout it samples, the filter does not
    waste = pd.read_csv(exp / "summary" / "waste.csv").set_index("arm")
    assert set(waste.index) == set(arms) and waste.loc["grpo_n16_m16", "rollouts_not_trained"] == 0
    ragen = waste.loc["ragen_filter_n16_m16"]
    assert ragen["rollouts_not_trained"] == 16 * (
        ragen["groups_discarded_zero_std"] + ragen["groups_discarded_low_std"]
    )
