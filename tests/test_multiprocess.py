"""Two real training processes on CPU (gloo), launched with `accelerate launch` as a user would."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.processes import kill_tree
from tests.tiny_runs import read_lines, tiny_run, without_timings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def two_process_command(config: Path) -> list[str]:
    """`accelerate launch` of two training processes. `--multi_gpu` selects accelerate's torchrun
    launcher; with `device: cpu` the processes join a gloo group on CPU. (`--cpu` alone starts one
    process unless mpirun is used.)"""
    accelerate = Path(sys.executable).with_name("accelerate")
    return [
        str(accelerate),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "pods_bench",
        "train",
        "--config",
        str(config),
        "--no-progress",
    ]


@pytest.mark.slow
def test_two_processes_train_identical_weights_and_log_once(tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(tiny_run(run_dir, budget={"max_steps": 2}, eval={"n_problems": 4})))
    done = subprocess.run(two_process_command(config), capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]

    info = json.loads((run_dir / "run.json").read_text())
    assert info["hardware"]["world_size"] == 2 and info["status"] == "finished"
    steps = read_lines(run_dir / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2]  # written once, by rank 0
    assert all(r["prompts"] == 4 and r["generated_tokens"] > 0 for r in steps)
    evals = read_lines(run_dir / "eval.jsonl")
    assert [e["checkpoint"] for e in evals] == ["step-000000", "step-000002"]

    hashes = []
    for name in ("step-000000", "step-000002"):
        folder = run_dir / "checkpoints" / name
        state = json.loads((folder / "state.json").read_text())
        ranks = [torch.load(folder / f"rank-{r}.pt", weights_only=False) for r in (0, 1)]
        assert state["world_size"] == 2
        assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"] == state["params_sha256"]
        # each process has its own random streams (different samples, same weights)
        assert not torch.equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])
        hashes.append(state["params_sha256"])
    assert hashes[0] != hashes[1]  # the weights did move, identically on both processes


@pytest.mark.slow
@pytest.mark.parametrize("optim", [{}, {"fsdp": True}], ids=["ddp", "fsdp"])
def test_two_processes_killed_together_resume_like_a_straight_run(tmp_path, optim):
    """SIGKILL to the launcher and both training processes (a preempted 8-GPU job, in small), then
    the same command again: the run resumes from its last checkpoint on both processes. Also with
    the weights, gradients and optimizer state sharded (FSDP): the checkpoint's gathered state is
    scattered back into the shards exactly."""
    settings = dict(
        budget={"max_steps": 6, "checkpoint_every_s": 3600, "checkpoint_every_steps": 2},
        eval={"n_problems": 4},
        reward={"workers": 1, "timeout_s": 10},  # wall-clock timeouts: not hit by chance on a busy machine
        optim=optim,
    )
    runs = {}
    for name in ("straight", "killed"):
        runs[name] = tmp_path / name
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(tiny_run(runs[name], **settings)))

    done = subprocess.run(
        two_process_command(tmp_path / "straight.yaml"), capture_output=True, text=True, timeout=600, env=ENV
    )
    assert done.returncode == 0, done.stderr[-3000:]

    job = subprocess.Popen(
        two_process_command(tmp_path / "killed.yaml"),
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    log = runs["killed"] / "train_log.jsonl"
    deadline = time.monotonic() + 300
    while not (log.exists() and log.read_text().count("\n") >= 3):  # past the step-2 checkpoint
        assert job.poll() is None and time.monotonic() < deadline, "the job ended before it could be killed"
        time.sleep(0.02)
    # the whole process tree at once, as a scheduler's cgroup kill does (torchrun puts its workers
    # in their own process groups, so killing the launcher's group alone would leave them running)
    killed, alive = kill_tree(job)
    assert len(killed) >= 3 and not alive  # launcher and two training processes (and grading workers)
    killed_at = len(read_lines(log))
    # the newest complete checkpoint: a step's log line comes before its checkpoint, so a kill right
    # after the line of step 4 leaves step-000002 as the newest
    newest = max(p.name for p in (runs["killed"] / "checkpoints").glob("step-*"))
    assert killed_at < 6 and newest in ("step-000002", "step-000004")

    done = subprocess.run(
        two_process_command(tmp_path / "killed.yaml"), capture_output=True, text=True, timeout=600, env=ENV
    )
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads((runs["killed"] / "run.json").read_text())
    assert [r["checkpoint"] for r in info["resumed"]] == [newest]
    for log_name in ("train_log.jsonl", "eval.jsonl"):
        assert without_timings(read_lines(runs["killed"] / log_name)) == without_timings(
            read_lines(runs["straight"] / log_name)
        )
    final = lambda run: json.loads((run / "checkpoints/step-000006/state.json").read_text())["params_sha256"]
    assert final(runs["killed"]) == final(runs["straight"])


def train_warm_started_on_two_processes(tmp_path, smoke_model_dir, **sections) -> None:
    """A run in tmp_path/run on two processes from the warm-started model (groups are mixed), the
    allocation and selection of `sections`."""
    config = tmp_path / "train.yaml"
    cfg = tiny_run(
        tmp_path / "run",
        model={"name": str(smoke_model_dir)},
        task={"name": "arith", "system_prompt": "", "limit": 24},
        sampling={"temperature": 1.0, "max_new_tokens": 24},
        optim={"lr": 1e-4, "micro_batch_size": 32},
        eval={"inline": False},
        **sections,
    )
    config.write_text(yaml.safe_dump(cfg))
    done = subprocess.run(two_process_command(config), capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_share_one_allocation_state(tmp_path, smoke_model_dir):
    """Pilot-Commit on two processes: every prompt decision is made from all-gathered outcomes, so the
    buffer's metadata, the evicted set and the log are one; each process holds the pilot rollouts it
    sampled and commits them itself. The warm-started model, so that pilots pass the window."""
    run_dir = tmp_path / "run"
    train_warm_started_on_two_processes(
        tmp_path,
        smoke_model_dir,
        selection={"rule": "max_variance", "n": 8, "m": 4},
        allocation={"strategy": "pilot_commit", "pilot_commit": {"pilot_prompts": 6, "pilot_rollouts": 4}},
        budget={"max_steps": 4},
    )

    steps = read_lines(run_dir / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(
        r["groups_trained"] == 4 and r["rollouts_pilot"] + r["rollouts_commit"] == r["rollouts_generated"]
        for r in steps
    )
    folder = run_dir / "checkpoints" / "step-000004"
    ranks = [torch.load(folder / f"rank-{r}.pt", weights_only=False) for r in (0, 1)]
    states = [r["allocation"] for r in ranks]
    assert states[0]["buffer"] == states[1]["buffer"] and states[0]["evicted"] == states[1]["evicted"]
    # not vacuous: prompts wait in the buffer, and each one's pilot rollouts are held somewhere (which
    # process owns them depends on which prompts passed the window, so either may hold none)
    assert states[0]["buffer"]
    assert sorted(p for state in states for p in state["pilots"]) == sorted(p for p, *_ in states[0]["buffer"])
    for rank, state in enumerate(states):  # each holds exactly the pilots of the buffered prompts it owns
        owned = sorted(p for p, _, owner, _, _ in state["buffer"] if owner == rank)
        assert sorted(state["pilots"]) == owned
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]


@pytest.mark.slow
def test_two_processes_train_groups_of_different_sizes(tmp_path, smoke_model_dir):
    """VIGOR on two processes: each samples its 4 of the 8 prompts in every round (a group's later
    rounds on the process that holds its first), so the groups of different sizes are split between
    the processes; the log counts all 64 rollouts of each step once and both end with the same weights."""
    run_dir = tmp_path / "run"
    train_warm_started_on_two_processes(
        tmp_path,
        smoke_model_dir,
        prompts_per_step=8,
        selection={"rule": "all", "n": 8, "m": 8},
        allocation={"strategy": "vigor"},
        budget={"max_steps": 2},
    )
    steps = read_lines(run_dir / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["rollouts_generated"] == r["rollouts_in_groups"] == 64 and r["groups_trained"] == 8
        assert (r["group_size_min"], r["group_size_max"], r["num_gen_batches"]) == (2, 30, 4)
    folder = run_dir / "checkpoints" / "step-000002"
    ranks = [torch.load(folder / f"rank-{r}.pt", weights_only=False) for r in (0, 1)]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
