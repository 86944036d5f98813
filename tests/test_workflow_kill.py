"""The workflow killed mid-run (SIGKILL to Snakemake and every job, as when a node dies) and rerun with
the same command completes only the missing jobs and reaches the same results as a run never killed.

A killed Snakemake leaves its lock behind, so the rerun is the documented two commands (docs/workflow.md):
`snakemake --unlock ...` then the original command. Training budgets are in steps and checkpoints
every 2 steps here, so that both workflows' runs are comparable record by record (a time budget
would end runs at different steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from pods_bench.io import read_jsonl
from tests.processes import kill_tree
from tests.test_workflow import CONFIG_DIR, SNAKEFILE, snakemake
from tests.test_workflow_run import check_success, write_yaml
from tests.tiny_runs import without_timings

pytestmark = pytest.mark.slow

SHORT_STEPS_SMOKE = {
    "seeds": [0, 1],
    "warm_start": {"name": "arith-tiny-test", "steps": 60},
    "train": {"budget": {"max_train_time_s": None, "max_steps": 6, "checkpoint_every_steps": 2,
                         "checkpoint_every_s": 3600},
              "eval": {"n_problems": 20}},
    "resources": {"train": {"runtime_min": 10}},  # a step budget gives the scheduler no runtime to derive
}
RUNS = ["grpo_n16_m16/seed0", "grpo_n16_m16/seed1", "pods_n16_m4/seed0", "pods_n16_m4/seed1"]
# what speedups.csv holds that does not depend on wall-clock times
CLOCK_FREE_COLUMNS = ["experiment", "benchmark", "metric", "baseline", "arm", "is_baseline", "n", "m", "rule", "n_seeds"]


def markers(workdir) -> dict[str, float]:
    """Finished jobs' markers -> modification time."""
    runs = workdir / "results" / "smoke" / "runs"
    return {p.relative_to(runs).as_posix(): p.stat().st_mtime for p in runs.glob("*/seed*/*.done")}


def run_records(workdir, run: str, log: str) -> list[dict]:
    return without_timings(read_jsonl(workdir / "results" / "smoke" / "runs" / run / log))


def test_a_killed_workflow_reruns_only_the_missing_jobs_and_reaches_the_same_results(tmp_path, data_dir):
    env = {"PODS_BENCH_DATA_DIR": str(data_dir)}
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir()
    killed.mkdir()
    configs = ["--configfile", str(CONFIG_DIR / "smoke.yaml"), write_yaml(tmp_path / "short.yaml", SHORT_STEPS_SMOKE)]
    command = ["--cores", "2", *configs]

    check_success(snakemake(reference, *command, env=env, timeout=900), "smoke")

    # the killed workflow: SIGKILL to the whole process group once a training job has finished and
    # another is under way
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(killed), *command],
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    runs = killed / "results" / "smoke" / "runs"
    deadline = time.monotonic() + 600
    while not (any(k.endswith("train.done") for k in markers(killed))
               and any((runs / r / "train_log.jsonl").exists() and not (runs / r / "train.done").exists() for r in RUNS)):
        assert proc.poll() is None, "the workflow ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not kill_tree(proc)[1]  # Snakemake and every job process; nothing survived
    done_before = markers(killed)
    interrupted = [r for r in RUNS if (runs / r / "run.json").exists() and f"{r}/train.done" not in done_before]
    resumable = {r: max(p.name for p in (runs / r / "checkpoints").glob("step-*"))
                 for r in interrupted if list((runs / r / "checkpoints").glob("step-*"))}
    assert done_before and interrupted and len(done_before) < 2 * len(RUNS)

    unlock = snakemake(killed, "--unlock", *configs)
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    rerun = snakemake(killed, *command, env=env, timeout=900)
    check_success(rerun, "smoke")
    print(f"\nworkflow killed with {len(done_before)} of {2 * len(RUNS)} run jobs done, "
          f"training interrupted in {interrupted}, resumed from {resumable}")

    # only the missing jobs ran again: finished jobs' markers are untouched
    after = markers(killed)
    assert {k: after[k] for k in done_before} == done_before
    assert set(after) == set(markers(reference))
    for run in resumable:  # the interrupted training resumed from its checkpoint instead of restarting
        info = json.loads((runs / run / "run.json").read_text())
        assert [r["checkpoint"] for r in info["resumed"]] == [resumable[run]]

    # the same results: every run's records (timings aside) and the clock-free part of the summary
    for run in RUNS:
        for log in ("train_log.jsonl", "eval.jsonl"):
            assert run_records(killed, run, log) == run_records(reference, run, log), (run, log)
    summary = lambda workdir: pd.read_csv(workdir / "results/smoke/summary/speedups.csv")[CLOCK_FREE_COLUMNS]  # noqa: E731
    pd.testing.assert_frame_equal(summary(killed), summary(reference))
