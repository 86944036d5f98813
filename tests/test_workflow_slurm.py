"""profiles/slurm on a real SLURM: a one-node cluster started on this machine (tests/cluster/slurm.py)
runs the shortened smoke experiment through sbatch, end to end, with a training job cancelled
(`scancel`) and later the Snakemake process itself SIGKILLed, and each time the same command resumes it.

What is checked: every job went through sbatch with its rule's resources (CPUs, memory, time limit, as
SLURM recorded them: sacct, scontrol); results, figures and the manifest are written and the manifest
names the SLURM jobs each run trained in; the cancelled training resumed from its checkpoint; no
finished job ran again and every step and evaluation record is there exactly once. Bad cluster
settings (no partition, a partition or an account the cluster does not know) stop the workflow with
one line before any submission. A job of a GPU hardware setup is submitted with `--gpus=l40s:1` and
SLURM schedules it on the node's (device-less) typed GPU.

Needs root (the cluster's daemons) and apt-get where SLURM is not installed: skipped otherwise, unless
PODS_BENCH_REQUIRE_SLURM=1 (CI sets it in .ci/run), where that is a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

import pytest
import yaml

from pods_bench.io import read_jsonl
from tests.processes import kill_tree
from tests.test_workflow import CONFIG_DIR, PROJECT_ROOT, snakemake
from tests.test_workflow_kill import markers, recorded, start_workflow, wait_until
from tests.test_workflow_run import TINY_MODEL, check_success, write_yaml

pytestmark = pytest.mark.slow

PROFILE = str(PROJECT_ROOT / "profiles" / "slurm")
MAX_STEPS = 4
SHORT_STEPS_SMOKE = {
    "budget_in_baseline_steps": None,  # a budget in steps, no calibration
    "seeds": [0],
    "warm_start": {"name": "arith-tiny-slurm-test", "steps": 2},  # the model's skill is not under test
    "train": {
        "task": {"limit": 64},  # a training job renders 64 prompts, not the split's 20,000
        "budget": {
            "max_train_time_s": None,
            "max_steps": MAX_STEPS,
            "checkpoint_every_steps": 2,
            "checkpoint_every_s": 3600,
        },
        "eval": {"n_problems": 10, "inline": False},  # the separate evaluation job is under test too
        "reward": {"timeout_s": 10},
    },
    "resources": {"train": {"runtime_min": 10}},
}
RUNS = ["grpo_n16_m16/seed0", "pods_n16_m8/seed0"]
# Test-only settings beside the documented command: status checks from 1 s after a submission
# instead of the plugin's 40 s, logs of successful jobs kept.
STATUS_CHECKS = ["--slurm-init-seconds-before-status-checks", "1", "--slurm-keep-successful-logs"]
# ... and Snakemake started with the plugin's growing wait between status checks capped (its docstring)
QUICK_STATUS = [sys.executable, str(PROJECT_ROOT / "tests" / "cluster" / "snakemake_quick_status.py")]


def require(reason: str):
    if os.environ.get("PODS_BENCH_REQUIRE_SLURM") == "1":
        pytest.fail(f"PODS_BENCH_REQUIRE_SLURM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.cluster.slurm import OneNodeSlurm, SlurmUnavailable

    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        require("snakemake-executor-plugin-slurm is not installed (make venv installs requirements/slurm.txt)")
    if os.geteuid() != 0:
        require("a one-node SLURM needs root")
    try:
        with OneNodeSlurm(tmp_path_factory.mktemp("slurm")) as one_node:
            yield one_node
    except SlurmUnavailable as e:
        require(str(e))


def submission(account: str = "pods", partition: str | None = "debug") -> list[str]:
    given = [f"slurm_account={account}"] + ([f"slurm_partition={partition}"] if partition else [])
    return ["--default-resources", *given]


def sacct_jobs(cluster) -> dict[str, dict]:
    """Job id -> {"rule", "state", "cpus", "mem", "timelimit", "tres"} of every job SLURM recorded."""
    out = cluster.run(
        "sacct", "-X", "-P", "-n", "-a", "--format=JobIDRaw,Comment,State,AllocCPUS,ReqMem,Timelimit,ReqTRES"
    )
    jobs = {}
    for line in out.stdout.splitlines():
        job_id, comment, state, cpus, mem, timelimit, tres = line.split("|")
        rule = comment.removeprefix("rule_").split("_wildcards_")[0]
        jobs[job_id] = {
            "rule": rule,
            "comment": comment,
            "state": state.split()[0],
            "cpus": int(cpus),
            "mem": mem,
            "timelimit": timelimit,
            "tres": tres,
        }
    return jobs


def squeue(cluster) -> dict[str, tuple[str, str]]:
    """Job id -> (state, comment) of the jobs SLURM has queued or running."""
    out = cluster.run("squeue", "-h", "-o", "%i|%T|%k")
    return {i: (s, c) for i, s, c in (line.split("|") for line in out.stdout.splitlines())}


def one_error_line(out) -> str:
    text = out.stdout + out.stderr
    lines = [line for line in text.splitlines() if line.startswith("pods-bench workflow:")]
    assert len(lines) == 1 and "Traceback" not in text, text[-3000:]
    return lines[0]


def test_bad_cluster_settings_stop_the_workflow_with_one_line(cluster, tmp_path, data_dir):
    configs = ["--configfile", str(CONFIG_DIR / "smoke.yaml"), write_yaml(tmp_path / "short.yaml", SHORT_STEPS_SMOKE)]
    env = {**cluster.env, "PODS_BENCH_DATA_DIR": str(data_dir)}
    before = set(sacct_jobs(cluster))
    cases = {
        "no partition": (submission(partition=None), "no partition given and the cluster has no default partition"),
        "unknown partition": (submission(partition="gpu"), "partition 'gpu' does not exist on this cluster"),
        "rejected account": (submission(account="nope"), "account 'nope' is not one of user root's accounts"),
    }
    for case, (settings, message) in cases.items():
        out = snakemake(tmp_path, "--profile", PROFILE, *configs, *settings, env=env, program=QUICK_STATUS)
        assert out.returncode == 2, (case, out.stderr[-3000:])
        line = one_error_line(out)
        assert message in line and "slurm_partition=" in line, (case, line)
    assert set(sacct_jobs(cluster)) == before, "a job was submitted"
    assert not (tmp_path / "results" / "smoke" / "runs").exists()


def test_the_smoke_workflow_through_sbatch_cancelled_killed_and_resumed(cluster, tmp_path, data_dir):
    env = {**cluster.env, "PODS_BENCH_DATA_DIR": str(data_dir)}
    configs = ["--configfile", str(CONFIG_DIR / "smoke.yaml"), write_yaml(tmp_path / "short.yaml", SHORT_STEPS_SMOKE)]
    command = ["--profile", PROFILE, *configs, *submission(), *STATUS_CHECKS]
    runs = tmp_path / "results" / "smoke" / "runs"
    started = time.monotonic()

    # 1. scancel a training job once it has written a checkpoint; the workflow goes on without it
    proc = start_workflow(tmp_path, command, env, QUICK_STATUS)

    def training_with_checkpoint():
        for job_id, (state, comment) in squeue(cluster).items():
            run = next((r for r in RUNS if comment == f"rule_train_wildcards_{r.replace('/seed', '_')}"), None)
            # a checkpoint after the start point (step 0), so that the resumed run has a step to skip
            if run and state == "RUNNING" and len(list((runs / run / "checkpoints").glob("step-*"))) > 1:
                return job_id, run
        return None

    cancelled_job, cancelled_run = wait_until(training_with_checkpoint, proc)
    cluster.run("scancel", cancelled_job)
    checkpoint_at_cancel = max(p.name for p in (runs / cancelled_run / "checkpoints").glob("step-*"))
    proc.wait(timeout=600)
    assert proc.returncode != 0  # the cancelled job failed the workflow (after the others, keep-going)
    assert not (runs / cancelled_run / "train.done").exists()
    done_before = recorded(tmp_path)

    # 2. the same command: the cancelled training is resubmitted; SIGKILL to Snakemake while it runs.
    # Its SLURM job outlives it, as on a login node that dies, and finishes.
    proc = start_workflow(tmp_path, command, env, QUICK_STATUS)
    wait_until(
        lambda: any(s == "RUNNING" and "rule_train" in c for s, c in squeue(cluster).values()),
        proc,
    )
    assert not kill_tree(proc)[1]
    orphans = squeue(cluster)
    assert orphans, "the training job ended with Snakemake"
    deadline = time.monotonic() + 600
    while squeue(cluster) and time.monotonic() < deadline:
        time.sleep(1)
    assert not squeue(cluster)
    after_kill = recorded(tmp_path)
    # the orphaned job recorded its training as finished itself: the rerun must not train it again
    assert f"{cancelled_run}/train.done" in after_kill

    # 3. unlock, the same command: only what is missing runs
    out = snakemake(tmp_path, "--profile", PROFILE, *configs, *submission(), "--unlock", env=env, program=QUICK_STATUS)
    assert out.returncode == 0, out.stderr[-2000:]
    out = snakemake(tmp_path, *command, env=env, timeout=900, program=QUICK_STATUS)
    check_success(out, "smoke")
    wall = time.monotonic() - started

    # nothing finished ran again; the cancelled run resumed from the checkpoint it had
    after = markers(tmp_path)
    assert {k: after[k] for k in done_before} == done_before
    assert {k: after[k] for k in after_kill} == after_kill
    info = json.loads((runs / cancelled_run / "run.json").read_text())
    assert info["resumed"][0]["checkpoint"] == checkpoint_at_cancel
    # nothing lost or duplicated: every step once, every (checkpoint, benchmark) once
    checkpoints = [f"step-{s:06d}" for s in range(0, MAX_STEPS + 1, 2)]
    for run in RUNS:
        assert [r["step"] for r in read_jsonl(runs / run / "train_log.jsonl")] == list(range(1, MAX_STEPS + 1)), run
        evals = [(r["checkpoint"], r["benchmark"]) for r in read_jsonl(runs / run / "eval.jsonl")]
        assert sorted(evals) == [(c, "arith") for c in checkpoints], run

    # every job went through sbatch, with its rule's resources as SLURM recorded them
    jobs = sacct_jobs(cluster)
    by_rule = {}
    for job_id, job in jobs.items():
        by_rule.setdefault(job["rule"], []).append(job_id)
    assert {"warm_start", "train", "evaluate", "aggregate", "plot"} <= set(by_rule), by_rule
    assert not {"train_config", "manifest", "all"} & set(by_rule)  # local rules run beside Snakemake
    for job_id in by_rule["train"]:
        assert (jobs[job_id]["cpus"], jobs[job_id]["mem"], jobs[job_id]["timelimit"]) == (1, "3000M", "00:10:00")
    for job_id in by_rule["evaluate"]:
        assert (jobs[job_id]["cpus"], jobs[job_id]["mem"], jobs[job_id]["timelimit"]) == (1, "3000M", "00:30:00")
    assert (jobs[by_rule["warm_start"][0]]["cpus"], jobs[by_rule["warm_start"][0]]["timelimit"]) == (2, "01:00:00")
    assert jobs[cancelled_job]["state"] == "CANCELLED"
    shown = cluster.run("scontrol", "show", "job", by_rule["train"][-1]).stdout
    assert "NumCPUs=1" in shown and "TimeLimit=00:10:00" in shown and "mem=3000M" in shown, shown
    assert "Partition=debug" in shown and "Account=pods" in shown

    # results, figures, and the manifest naming the SLURM jobs each run trained in
    summary = tmp_path / "results" / "smoke" / "summary"
    assert (summary / "speedups.csv").stat().st_size > 0
    assert list((tmp_path / "figures" / "smoke").glob("*.png"))
    manifest = yaml.safe_load((summary / "manifest.yaml").read_text())
    trained_in = {r["run_dir"].split("runs/")[1]: [j["job_id"] for j in r["scheduler_jobs"]] for r in manifest["runs"]}
    assert set(trained_in) == set(RUNS)
    assert all(set(ids) <= set(by_rule["train"]) for ids in trained_in.values()), (trained_in, by_rule)
    assert trained_in[cancelled_run][0] == cancelled_job and len(trained_in[cancelled_run]) >= 2
    assert all(
        j["partition"] == "debug" and j["account"] == "pods" for r in manifest["runs"] for j in r["scheduler_jobs"]
    )
    print(
        f"\nsmoke workflow through sbatch in {wall:.0f} s: {len(jobs)} SLURM jobs; train job {cancelled_job} "
        f"({cancelled_run}) cancelled at {checkpoint_at_cancel} and resumed; Snakemake killed with "
        f"{len(orphans)} job(s) running, which finished on their own"
    )


def test_a_gpu_setup_job_asks_slurm_for_its_typed_gpu(cluster, tmp_path, data_dir):
    # gsm8k_main on the l40s setup, its model swapped for the tiny one and the job shrunk to this node's
    # CPUs and memory: the training job is submitted with --gpus=l40s:1 and scheduled on the node's
    # l40s, which has no device behind it, so the trainer (device cuda) fails there: a placeholder.
    override = {
        **TINY_MODEL,
        "hardware": "l40s",
        "resources": {"train": {"runtime_min": 10, "cpus": 1, "mem_mb": 3000}},
    }
    configs = ["--configfile", str(CONFIG_DIR / "gsm8k_main.yaml"), write_yaml(tmp_path / "l40s.yaml", override)]
    env = {**cluster.env, "PODS_BENCH_DATA_DIR": str(data_dir)}
    target = "results/gsm8k_main/runs/pods_n64_m16/seed1/train.done"
    out = snakemake(
        tmp_path,
        target,
        "--profile",
        PROFILE,
        *configs,
        *submission(),
        *STATUS_CHECKS,
        env=env,
        timeout=600,
        program=QUICK_STATUS,
    )
    assert (
        "config key device is 'cuda' but no GPU is visible"
        in (tmp_path / "results/gsm8k_main/logs/train/pods_n64_m16/seed1.log").read_text()
    )
    assert out.returncode != 0  # no CUDA on the node
    jobs = {i: j for i, j in sacct_jobs(cluster).items() if j["comment"] == "rule_train_wildcards_pods_n64_m16_1"}
    assert len(jobs) == 1, jobs
    job_id, job = next(iter(jobs.items()))
    assert "gres/gpu:l40s=1" in job["tres"] or "gres/gpu=1" in job["tres"], job
    shown = cluster.run("scontrol", "show", "job", job_id).stdout
    assert "TresPerJob=gres:gpu:l40s:1" in shown, shown
    assert job["state"] == "FAILED"
