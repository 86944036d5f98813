"""Optimizer state sharded across processes (`optim.shard_optimizer_state`, ZeRO stage 1 through
PyTorch's ZeroRedundancyOptimizer), two real processes on CPU (gloo): the same weights as unsharded
AdamW, and a resumed run restores the consolidated optimizer state exactly."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
import yaml

from tests.test_multiprocess import ENV, two_process_command
from tests.tiny_runs import read_lines, tiny_run, without_timings

pytestmark = pytest.mark.slow
SETTINGS = dict(
    budget={"max_steps": 4, "checkpoint_every_s": 3600, "checkpoint_every_steps": 2}, eval={"inline": False}
)


def launch(tmp_path, name: str, run_dir, **changes):
    config = tmp_path / f"{name}.yaml"
    settings = tiny_run(run_dir, **SETTINGS)
    for section, values in changes.items():
        settings[section] = {**settings.get(section, {}), **values}
    config.write_text(yaml.safe_dump(settings))
    done = subprocess.run(two_process_command(config), capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]


def final_sha(run_dir) -> str:
    return json.loads((run_dir / "checkpoints/step-000004/state.json").read_text())["params_sha256"]


def test_sharded_adamw_equals_adamw_and_resumes_exactly(tmp_path):
    plain, sharded = tmp_path / "plain", tmp_path / "sharded"
    launch(tmp_path, "plain", plain)
    # sharded: 2 steps, then the same run resumed to 4 (the optimizer state comes back from the checkpoint)
    launch(tmp_path, "sharded-a", sharded, optim={"shard_optimizer_state": True}, budget={"max_steps": 2})

    # the checkpoint holds the whole optimizer state, gathered from both shards: AdamW's own moments
    def state(run):
        return torch.load(run / "checkpoints/step-000002/trainer.pt", weights_only=False)["optimizer"]["state"]

    gathered, reference = state(sharded), state(plain)
    assert sorted(gathered) == sorted(reference) and len(reference) > 10
    for index, moments in reference.items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(gathered[index][key], moments[key]), (index, key)
    launch(tmp_path, "sharded-b", sharded, optim={"shard_optimizer_state": True})

    assert [r["checkpoint"] for r in json.loads((sharded / "run.json").read_text())["resumed"]] == ["step-000002"]
    assert without_timings(read_lines(sharded / "train_log.jsonl")) == without_timings(
        read_lines(plain / "train_log.jsonl")
    )
    assert final_sha(sharded) == final_sha(plain)
