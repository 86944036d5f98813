"""Full fine-tuning sharded with FSDP2 (`optim.fsdp`, pods_bench/sharding.py), two real processes on
CPU (gloo): the sharded update's gradient is the whole batch's, for every loss aggregation; a
sharded run trains as the unsharded one does and its checkpoints are ordinary float32 model folders;
under bf16 the shards stay float32 while compute and generation see bf16. The kill -9 resume of a
sharded run is in tests/test_multiprocess.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.test_logprobs import TWO_PROCESS_CASES, check_whole_batch_gradients, run_on_two_processes
from tests.test_multiprocess import ENV, two_process_command
from tests.tiny_runs import read_lines, tiny_run

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

SHARDED_UPDATE = """
import json, sys, torch
from dataclasses import replace
from accelerate import Accelerator
from pods_bench.checkpoint import load_policy
from pods_bench.sharding import full_model_state, is_sharded, shard
from pods_bench.update import Learner, update_policy
from tests.test_logprobs import make_cfg, make_sequences
accelerator = Accelerator(cpu=True)
share = make_sequences()[accelerator.process_index :: 2]
out = {}
for aggregation, rows_per_pass, chunk in json.loads(sys.argv[1]):
    cfg = make_cfg(aggregation, rows_per_pass, chunk, micro=2)
    cfg = replace(cfg, optim=replace(cfg.optim, fsdp=True))
    policy, tokenizer = load_policy(cfg)
    names = [name for name, _ in policy.named_parameters()]
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    shard(policy, cfg, accelerator.device)
    assert is_sharded(policy)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    update_policy(Learner(policy, policy, None, optimizer, scheduler, accelerator, tokenizer.pad_token_id), share, cfg)
    after = full_model_state(policy)  # rank 0 only
    if accelerator.is_main_process:
        out[f"{aggregation}/{rows_per_pass}/{chunk}"] = torch.cat([(before[n] - after[n]).flatten() for n in names]).tolist()
if accelerator.is_main_process:
    print("RESULT " + json.dumps(out))
"""


def test_the_sharded_update_gives_the_gradient_of_the_whole_batch(tmp_path):
    """SGD with learning rate 1 on the shards: the step is minus the reduce-scattered gradient, which
    must equal the gradient of the whole batch's loss built by hand (tests/test_logprobs.py)."""
    check_whole_batch_gradients(run_on_two_processes(SHARDED_UPDATE, tmp_path, json.dumps(TWO_PROCESS_CASES)))


EXPORT = """
import sys
from pathlib import Path
import torch
from accelerate import Accelerator
from pods_bench.checkpoint import load_policy
from pods_bench.engines.vllm import export_weights
from pods_bench.sharding import shard
from tests.test_logprobs import make_cfg
accelerator = Accelerator(cpu=True)
cfg = make_cfg("sequence")
policy, _ = load_policy(cfg)
whole = {k: v.clone() for k, v in policy.state_dict().items()}
shard(policy, cfg, accelerator.device)
local = sum(p.to_local().numel() for p in policy.parameters())
exported = dict(export_weights(policy))  # every process runs the gathers in the same order
assert sorted(exported) == sorted(whole), sorted(set(exported) ^ set(whole))
assert all(torch.equal(exported[k], whole[k]) for k in whole)
assert local < sum(p.numel() for p in whole.values()) * 0.75  # the process held only its share
# a file per process: two processes printing to one pipe can interleave their lines
(Path(sys.argv[1]) / f"exported-{accelerator.process_index}").write_text(str(len(exported)))
"""


def test_the_engine_weight_sync_gathers_sharded_weights(tmp_path):
    """vLLM's weight sync (export_weights) from a sharded model: on every process the exact whole
    tensors, under the checkpoint's names, while each process holds about half of them."""
    run_on_two_processes(EXPORT, tmp_path, str(tmp_path))
    assert sorted(path.name for path in tmp_path.glob("exported-*")) == ["exported-0", "exported-1"]


def launch(tmp_path: Path, name: str, **sections) -> Path:
    run_dir = tmp_path / name
    config = tmp_path / f"{name}.yaml"
    settings = tiny_run(run_dir, budget={"max_steps": 2, "checkpoint_every_s": 3600}, eval={"n_problems": 4})
    for section, values in sections.items():
        settings[section] = {**settings.get(section, {}), **values}
    config.write_text(yaml.safe_dump(settings))
    done = subprocess.run(two_process_command(config), capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_a_sharded_run_trains_as_the_unsharded_one(tmp_path):
    """Float32 both: the first step samples the same rollouts from the same initial weights and takes
    the same update (AdamW turns the last bits of a gradient entry near 0 into a whole lr-sized step
    of either sign, so weights are compared element by element with that in mind)."""
    every_problem = {"n_problems": 4, "n_examples": 4}  # both processes' slices in the examples
    plain = launch(tmp_path, "ddp", budget={"max_steps": 1}, eval=every_problem)
    sharded = launch(tmp_path, "fsdp", budget={"max_steps": 1}, optim={"fsdp": True}, eval=every_problem)
    assert json.loads((sharded / "run.json").read_text())["hardware"]["sharding"] == "fsdp2"
    a, b = read_lines(plain / "train_log.jsonl")[0], read_lines(sharded / "train_log.jsonl")[0]
    for key in ("reward_mean", "reward_std", "generated_tokens", "trained_tokens", "loss"):
        assert a[key] == b[key], key
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    weights = [load_file(run / "checkpoints/step-000001/model/model.safetensors") for run in (plain, sharded)]
    assert sorted(weights[0]) == sorted(weights[1])
    for name, w in weights[0].items():
        assert weights[1][name].dtype == torch.float32
        differs = (w - weights[1][name]).abs() > 1e-6
        assert differs.float().mean() < 0.01, name  # a few sign flips at most
    # the step-0 evaluation (each process generating its slice on the gathered weights) saw the same model
    evals = [read_lines(run / "eval.jsonl")[0] for run in (plain, sharded)]
    assert evals[0]["checkpoint"] == "step-000000" and evals[0]["eval_processes"] == 2
    assert len(evals[0]["examples"]) == 4 and evals[0]["examples"] == evals[1]["examples"]
    assert evals[0]["answer_acc"] == evals[1]["answer_acc"] and evals[0]["mean_length"] == evals[1]["mean_length"]


def test_bf16_compute_keeps_float32_shards(tmp_path):
    """mixed_precision bf16: FSDP gathers bf16 parameters for compute and generation, the shards
    (master weights) and so the checkpoints stay float32, and the weights move."""
    run = launch(tmp_path, "bf16", model={"mixed_precision": "bf16"}, optim={"fsdp": True})
    info = json.loads((run / "run.json").read_text())
    assert info["hardware"]["mixed_precision"] == "bf16" and info["status"] == "finished"
    steps = read_lines(run / "train_log.jsonl")
    assert len(steps) == 2 and all(r["grad_norm"] > 0 for r in steps)
    first, last = (load_file(run / f"checkpoints/{c}/model/model.safetensors") for c in ("step-000000", "step-000002"))
    assert {t.dtype for t in last.values()} == {torch.float32}
    assert any(not torch.equal(first[k], last[k]) for k in first)


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_samples_from_the_sharded_weights(tmp_path):
    """Each process's vLLM engine is synced from the shards after every update: the evaluation of the
    last checkpoint (same seeds) samples other completions than the first one's."""
    run = launch(
        tmp_path,
        "vllm",
        # vLLM's CPU attention needs head_dim >= 32
        model={
            "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128}
        },
        engine={"name": "vllm", "options": {"max_model_len": 512}},
        optim={"fsdp": True, "lr": 1e-2},
    )
    steps = read_lines(run / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2] and all(r["grad_norm"] > 0 for r in steps)
    evals = read_lines(run / "eval.jsonl")
    assert [e["completion"] for e in evals[0]["examples"]] != [e["completion"] for e in evals[-1]["examples"]]
