"""Two real training processes on CPU (gloo), launched with `accelerate launch` as a user would."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.tiny_runs import read_lines, tiny_run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_identical_weights_and_log_once(tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(tiny_run(run_dir, budget={"max_steps": 2}, eval={"n_problems": 4})))
    accelerate = Path(sys.executable).with_name("accelerate")
    # `--multi_gpu` selects accelerate's torchrun launcher; with `device: cpu` the processes join a
    # gloo group on CPU. (`--cpu` alone starts one process unless mpirun is used.)
    command = [
        str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        "-m", "pods_bench", "train", "--config", str(config), "--no-progress",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
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
