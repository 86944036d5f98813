"""The workflow killed mid-run (SIGKILL to Snakemake and every job, as when a node dies) and rerun with
the same command completes only the missing jobs and reaches the same results as a run never killed.

A killed Snakemake leaves its lock behind, so the rerun is the documented two commands (docs/workflow.md):
`snakemake --profile profiles/local --unlock ...` then the original command. Training budgets are in
steps and checkpoints every 2 steps here, so that both workflows' runs are comparable record by record
(a time budget would end runs at different steps).

The workflow is killed twice: once while training jobs are under way, and once in the window between a
training job's marker being written and Snakemake recording the job as finished (~1 ms, hardly ever hit
by chance). A kill there leaves a marker Snakemake knows to be incomplete; the rerun must redo that job
(the profile's `rerun-incomplete`) instead of stopping with IncompleteFilesException. The test holds
Snakemake in that window: Snakemake reads a job's metadata record right after writing its marker, and
a FIFO put in place of the record keeps that read waiting until the kill.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from base64 import urlsafe_b64encode
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from pods_bench.io import read_jsonl
from tests.conftest import TEST_WARM_START, place_warm_start
from tests.processes import kill_tree, running_beside
from tests.test_workflow import CONFIG_DIR, PROJECT_ROOT, SNAKEMAKE, snakemake, snakemake_command
from tests.test_workflow_run import check_success, write_yaml
from tests.tiny_runs import without_timings

pytestmark = pytest.mark.slow

SHORT_STEPS_SMOKE = {
    "budget_in_baseline_steps": None,  # a budget in steps, no calibration
    # one seed: two training jobs, which the two cores run side by side; PODS's (the cheaper steps)
    # ends first, so the first kill finds one job finished and the other under way
    "seeds": [0],
    "warm_start": TEST_WARM_START,  # built once for the test run, given to both workflows
    "train": {
        "task": {"limit": 64},  # a training job renders 64 prompts, not the split's 20,000
        "budget": {"max_train_time_s": None, "max_steps": 6, "checkpoint_every_steps": 2, "checkpoint_every_s": 3600},
        "eval": {"n_problems": 20, "inline": False},  # the separate evaluation job is under test too
        # math-verify's timeouts are wall-clock: on a busy machine a parse can pass the default 1 s in
        # one workflow and not in the other (reward_failures, and rewards, would then differ)
        "reward": {"timeout_s": 10},
    },
    "resources": {"train": {"runtime_min": 10}},  # a step budget gives the scheduler no runtime to derive
}
RUNS = ["grpo_n16_m16/seed0", "pods_n16_m8/seed0"]
PROFILE = str(PROJECT_ROOT / "profiles" / "local")  # the documented commands' profile (rerun-incomplete)
# what speedups.csv holds that does not depend on wall-clock times
CLOCK_FREE_COLUMNS = [
    "experiment",
    "benchmark",
    "metric",
    "baseline",
    "arm",
    "is_baseline",
    "n",
    "m",
    "rule",
    "n_seeds",
]


def markers(workdir) -> dict[str, float]:
    """Finished jobs' markers -> modification time."""
    runs = workdir / "results" / "smoke" / "runs"
    return {p.relative_to(runs).as_posix(): p.stat().st_mtime for p in runs.glob("*/seed*/*.done")}


def run_records(workdir, run: str, log: str) -> list[dict]:
    return without_timings(read_jsonl(workdir / "results" / "smoke" / "runs" / run / log))


def train_marker(run: str) -> str:
    return f"results/smoke/runs/{run}/train.done"


def snakemake_record(workdir, kind: str, output: str) -> Path:
    """Snakemake's record of `output` (a path relative to the workdir): "incomplete" from the start of
    the job that writes it until the job is recorded as finished, "metadata" from then on; named by the
    path in URL-safe base64 (snakemake/persistence/file.py; names this short are not split)."""
    return workdir / ".snakemake" / kind / urlsafe_b64encode(output.encode()).decode()


def recorded(workdir) -> dict[str, float]:
    """Markers of the jobs Snakemake has recorded as finished -> modification time (a kill can also
    land, by chance, between a marker and its record: that job is rerun)."""
    return {
        k: t
        for k, t in markers(workdir).items()
        if not snakemake_record(workdir, "incomplete", f"results/smoke/runs/{k}").exists()
    }


def start_workflow(workdir, command: list[str], env: dict, program: list[str] = SNAKEMAKE) -> subprocess.Popen:
    return subprocess.Popen(
        snakemake_command(workdir, command, program),
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_until(condition, proc: subprocess.Popen, timeout_s: float = 600):
    """Poll `condition()` until it returns something true, while the workflow runs."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert proc.poll() is None, "the workflow ended before it could be killed"
        if time.monotonic() >= deadline:
            kill_tree(proc)  # a failed wait leaves no workflow running behind it
            raise AssertionError(f"waited {timeout_s} s for the workflow to get there")
        time.sleep(0.05)
    return found


@contextmanager
def reference_workflow_beside(workdir, command: list[str], env: dict):
    """The never-killed workflow, run in `workdir` while the block kills and reruns its twin: its jobs
    share the cores with the twin's (records do not depend on time: budgets are in steps, each job on
    one torch thread). Checked for success when the block ends; killed if the block fails."""
    logs = {name: workdir.parent / f"reference.{name}" for name in ("stdout", "stderr")}
    with open(logs["stdout"], "w") as stdout, open(logs["stderr"], "w") as stderr:
        workflow = subprocess.Popen(
            snakemake_command(workdir, command),
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # out of reach of the kills aimed at the twin
        )
        with running_beside(workflow) as proc:
            yield
    out = {name: path.read_text() for name, path in logs.items()}
    check_success(subprocess.CompletedProcess(proc.args, proc.returncode, out["stdout"], out["stderr"]), "smoke")


def unlock(workdir, configs: list[str]) -> None:
    out = snakemake(workdir, "--profile", PROFILE, *configs, "--unlock")
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_killed_workflow_reruns_only_the_missing_jobs_and_reaches_the_same_results(
    tmp_path, data_dir, warm_start_seed0
):
    env = {"PODS_BENCH_DATA_DIR": str(data_dir)}
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    for workdir in (reference, killed):
        place_warm_start(warm_start_seed0, workdir)
    configs = ["--configfile", str(CONFIG_DIR / "smoke.yaml"), write_yaml(tmp_path / "short.yaml", SHORT_STEPS_SMOKE)]
    # the documented command, on 2 cores whatever the machine: two jobs at a time, as the kills expect
    command = ["--profile", PROFILE, "--cores", "2", *configs]

    # the never-killed twin runs beside the kills (jobs 4 at a time on 2 cores; results do not depend on time)
    with reference_workflow_beside(reference, command, env):
        # 1. SIGKILL to Snakemake and every job once a training job has finished and another is under way
        runs = killed / "results" / "smoke" / "runs"
        proc = start_workflow(killed, command, env)
        wait_until(
            lambda: (
                any(k.endswith("train.done") for k in recorded(killed))
                and any(
                    (runs / r / "train_log.jsonl").exists() and not (runs / r / "train.done").exists() for r in RUNS
                )
            ),
            proc,
        )
        assert not kill_tree(proc)[1]  # Snakemake and every job process; nothing survived
        done_before = recorded(killed)
        interrupted = [r for r in RUNS if (runs / r / "run.json").exists() and f"{r}/train.done" not in done_before]
        resumable = {
            r: max(p.name for p in (runs / r / "checkpoints").glob("step-*"))
            for r in interrupted
            if list((runs / r / "checkpoints").glob("step-*"))
        }
        assert done_before and interrupted and len(done_before) < 2 * len(RUNS)
        unlock(killed, configs)

        # 2. the same command, killed between a training job's marker and Snakemake's record of the job.
        # Once this Snakemake has started a training job (its records of earlier jobs are read), a FIFO in
        # place of each missing marker's metadata record: the first training job to end leaves Snakemake
        # waiting to read its record, with the marker written and the job still marked incomplete.
        pending = [r for r in RUNS if not (runs / r / "train.done").exists()]
        started_at = time.time()
        proc = start_workflow(killed, command, env)
        wait_until(
            lambda: any(
                record.exists() and record.stat().st_mtime >= started_at
                for record in (snakemake_record(killed, "incomplete", train_marker(r)) for r in pending)
            ),
            proc,
        )
        fifos = [snakemake_record(killed, "metadata", train_marker(r)) for r in pending]
        for fifo in fifos:
            fifo.parent.mkdir(parents=True, exist_ok=True)
            os.mkfifo(fifo)
        held = wait_until(lambda: [r for r in pending if (runs / r / "train.done").exists()], proc)[0]
        assert not kill_tree(proc)[1]
        assert all(stat.S_ISFIFO(fifo.stat().st_mode) for fifo in fifos)  # no record was written in their place
        for fifo in fifos:
            fifo.unlink()
        assert snakemake_record(killed, "incomplete", train_marker(held)).exists(), "the kill missed the window"
        held_marker = markers(killed)[f"{held}/train.done"]
        unlock(killed, configs)

        # 3. the same command completes the workflow
        rerun = snakemake(killed, *command, env=env, timeout=900)
        check_success(rerun, "smoke")
        print(
            f"\nworkflow killed with {len(done_before)} of {2 * len(RUNS)} run jobs done, "
            f"training interrupted in {interrupted}, resumed from {resumable}; "
            f"killed again between {held}'s marker and its record"
        )

    # only the missing jobs ran again: finished jobs' markers are untouched; the job killed in the
    # window ran again (rerun-incomplete), and its run, trained to the end, resumed from its last checkpoint
    after = markers(killed)
    assert {k: after[k] for k in done_before} == done_before
    assert after[f"{held}/train.done"] > held_marker
    assert set(after) == set(markers(reference))
    for run in resumable:  # the interrupted training resumed from its checkpoint instead of restarting
        info = json.loads((runs / run / "run.json").read_text())
        assert info["resumed"][0]["checkpoint"] == resumable[run]
    held_info = json.loads((runs / held / "run.json").read_text())
    assert held_info["resumed"][-1]["checkpoint"] == f"step-{SHORT_STEPS_SMOKE['train']['budget']['max_steps']:06d}"

    # the same results: every run's records (timings aside) and the clock-free part of the summary
    for run in RUNS:
        for log in ("train_log.jsonl", "eval.jsonl"):
            assert run_records(killed, run, log) == run_records(reference, run, log), (run, log)
    summary = lambda workdir: pd.read_csv(workdir / "results/smoke/summary/speedups.csv")[CLOCK_FREE_COLUMNS]
    pd.testing.assert_frame_equal(summary(killed), summary(reference))
