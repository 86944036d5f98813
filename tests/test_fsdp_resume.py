"""Start-up and resume of a run FSDP shards (pods_bench/sharding.py), two real processes on CPU
(gloo): rank 0 alone reads the weights and the optimizer state, every other process holds only its
shards, and what they hold equals the checkpoint (weights, AdamW state, scheduler, tied embeddings,
the rotary buffers outside the state dict). The kill -9 resume of a sharded run, which checks that
the resumed run trains as a straight one, is in tests/test_multiprocess.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_multiprocess import ENV, free_port, two_process_command
from tests.tiny_runs import tiny_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset"),
]
ROOT = Path(__file__).resolve().parents[1]

# large enough that a whole copy shows in the resident set: 27 M parameters, 109 MB in float32
# (AdamW's state twice that), in tensors of at most 3 MB (the processes receive one whole tensor at a
# time), against a few MB of everything else start-up allocates
LARGE = {"hidden_size": 512, "num_layers": 8, "num_heads": 4, "num_kv_heads": 4, "intermediate_size": 1536}

RESUME = r"""
import json, re, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
from accelerate.utils import set_seed  # noqa: F401  (imported before anything is measured)
from transformers import LlamaForCausalLM, get_scheduler  # noqa: F401
from pods_bench import checkpoint as ckpt
from pods_bench.allocation import make_allocator
from pods_bench.config import load_config
from pods_bench.models import build_char_tokenizer
from pods_bench.sharding import full_model_state, full_optimizer_state
from pods_bench.sampling import load_training_prompts
from pods_bench.train import make_accelerator
from pods_bench.update import make_learner

config, checkpoint, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
cfg = load_config(config)
accelerator = make_accelerator(cfg)
rank, main = accelerator.process_index, accelerator.is_main_process
problems, _, _ = load_training_prompts(cfg.task, cfg.data_dir, build_char_tokenizer())  # data loading is not measured
allocator, generator = make_allocator(cfg, len(problems)), torch.Generator()
status = lambda key: int(re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024


def peak_growth(step):
    # the peak resident set while `step` runs, above the resident set before it
    accelerator.wait_for_everyone()
    before = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the current RSS
    result = step()
    return result, status("VmHWM") - before


# what `pods-bench train` does on resume (prepare_run), in its two parts
learner, model_growth = peak_growth(lambda: make_learner(cfg, accelerator, checkpoint)[0])
_, optimizer_growth = peak_growth(lambda: ckpt.load_training_state(checkpoint, learner, generator, allocator))

policy = learner.policy
record = {"model_growth": model_growth, "optimizer_growth": optimizer_growth}
record["tied"] = policy.lm_head.weight is policy.model.embed_tokens.weight
fresh, _ = ckpt.load_policy(cfg, checkpoint)  # whole, as a single process loads it
record["model_bytes"] = sum(p.numel() * p.element_size() for p in fresh.parameters())
record["buffers"] = sorted(name for name, _ in policy.named_buffers())
record["buffers_equal"] = all(torch.equal(b, fresh.get_buffer(name)) for name, b in policy.named_buffers())
weights, optimizer = full_model_state(policy), full_optimizer_state(policy, learner.optimizer)  # on rank 0
record["whole_state_held"] = [len(weights), len(optimizer.get("state", {}))]  # tensors; none outside rank 0
if main:
    saved_weights = load_file(checkpoint / "model" / "model.safetensors")
    record["weights_equal"] = sorted(weights) == sorted(saved_weights) and all(
        torch.equal(weights[k], saved_weights[k]) for k in saved_weights
    )
    saved = torch.load(checkpoint / "trainer.pt", weights_only=False)
    state, saved_state = optimizer["state"], saved["optimizer"]["state"]
    record["optimizer_params"] = len(saved_state)
    record["optimizer_equal"] = sorted(state) == sorted(saved_state) and all(
        sorted(state[p]) == sorted(saved_state[p]) and all(torch.equal(state[p][k], saved_state[p][k]) for k in state[p])
        for p in saved_state
    )
    as_lists = lambda groups: json.loads(json.dumps(groups))  # betas come back as a list, not a tuple
    record["param_groups_equal"] = as_lists(optimizer["param_groups"]) == as_lists(saved["optimizer"]["param_groups"])
record["scheduler"] = learner.scheduler.state_dict()
record["scheduler_equal"] = record["scheduler"] == torch.load(checkpoint / "trainer.pt", weights_only=False)["scheduler"]
(out / f"rank-{rank}.json").write_text(json.dumps(record, default=str))
"""


def run_script(script: str, tmp_path: Path, *args: str) -> None:
    """`script` as two gloo processes (torchrun) from the project root, with glibc's mmap threshold
    fixed so that freed blocks go back to the system and the resident set follows what torch holds."""
    path = tmp_path / "two_processes.py"
    path.write_text(script)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_port", str(free_port()), str(path), *args]
    env = {**ENV, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_resumed_sharded_run_holds_no_whole_copy_outside_rank_0(tmp_path):
    """A sharded run of the larger tiny model trains 2 steps, then a process pair starts up from its
    last checkpoint as `pods-bench train` does on resume, and rank 1's resident set is measured in
    the two parts, each against the whole state it loads:
      - the model (make_learner): its half of the float32 weights is 0.5 of a whole model, plus one
        whole tensor at a time as they are broadcast; below 0.75. A whole copy is 1.0 on its own.
      - the optimizer state (load_training_state): its half of AdamW's moments is 0.5 of the whole
        state, plus the zero-gradient step with which torch creates them before loading (a gradient
        shard and AdamW's temporaries, about 0.3 measured); below 1.0. A whole copy is 1.0 on its own.
    (With two processes a process's own shards are half of everything, so a bound on the sum of both
    parts would not tell a whole copy of the model apart: the two peaks do not add up.) What every
    process holds is the checkpoint's, exactly."""
    run_dir = tmp_path / "run"
    settings = tiny_run(
        run_dir,
        model={"tiny": LARGE},
        optim={"fsdp": True},
        budget={"max_steps": 2, "checkpoint_every_s": 3600},
        eval={"n_problems": 2},
    )
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(settings))
    done = subprocess.run(two_process_command(config), capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = run_dir / "checkpoints" / "step-000002"
    settings["budget"]["max_steps"] = 4  # resumed with a larger budget
    config.write_text(yaml.safe_dump(settings))

    run_script(RESUME, tmp_path, str(config), str(checkpoint), str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    print(json.dumps([{k: r[k] for k in ("model_growth", "optimizer_growth", "model_bytes")} for r in ranks]))
    main, other = ranks
    assert main["weights_equal"] and main["optimizer_equal"] and main["param_groups_equal"]
    assert main["optimizer_params"] > 0  # the checkpoint holds AdamW's moments (written after steps)
    assert main["whole_state_held"][0] > 0 and main["whole_state_held"][1] == main["optimizer_params"]
    assert other["whole_state_held"] == [0, 0]  # saving gathers the whole state on rank 0 alone
    for r in ranks:
        assert r["tied"] and r["scheduler_equal"] and r["scheduler"]["last_epoch"] == 2
        assert r["buffers_equal"] and "model.rotary_emb.inv_freq" in r["buffers"]
    model_bytes = other["model_bytes"]  # AdamW's state: two moments of every parameter
    assert other["model_growth"] < 0.75 * model_bytes
    assert other["optimizer_growth"] < 1.0 * 2 * model_bytes
