"""`pods-bench plan` and the step-time model: parameter counts against real models, the memory
arithmetic against hand-worked cases and against the measured peak memory of real updates on this
CPU, the fit check that stops a workflow, and the step-time model's fit and features."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pods_bench.config import config_from_dict
from pods_bench.errors import PodsBenchError
from pods_bench.experiment import hardware_setup, load_experiment, resolve_runs
from pods_bench.planning.architecture import ModelDims, known_models, model_dims
from pods_bench.planning.memory import GIB, Lengths, memory_estimate
from pods_bench.planning.plan import check_fits, plan
from pods_bench.planning.step_time import PHASE_FEATURES, StepLengths, StepTimeModel, fit, predict, step_features

ROOT = Path(__file__).resolve().parents[1]
TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64}


def tiny_cfg(**sections):
    base = {"model": {"name": "tiny", "tiny": TINY}, "budget": {"max_steps": 1}, "device": "cpu"}
    return config_from_dict({**base, **sections})


# --- parameter counts ----------------------------------------------------------------------------


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_parameter_count_equals_the_built_model(architecture):
    from pods_bench.models import build_char_tokenizer, build_tiny_model

    cfg = tiny_cfg(model={"name": "tiny", "tiny": {**TINY, "architecture": architecture}})
    model = build_tiny_model(cfg.model.tiny, build_char_tokenizer())
    assert model_dims(cfg.model).params == sum(p.numel() for p in model.parameters())
    assert model_dims(cfg.model).head_dim == model.config.head_dim  # Qwen3: 128, not hidden / heads


def test_lora_parameter_count_equals_peft():
    from peft import LoraConfig, get_peft_model

    from pods_bench.models import build_char_tokenizer, build_tiny_model

    cfg = tiny_cfg(lora={"enabled": True, "r": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]})
    model = get_peft_model(
        build_tiny_model(cfg.model.tiny, build_char_tokenizer()),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM"),
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    dims = model_dims(cfg.model)
    # by hand: 2 layers x r x ((32 + 32) + (32 + 16) + (64 + 32))
    assert dims.lora_params(4, cfg.lora.target_modules) == trainable == 2 * 4 * (64 + 48 + 96)


def test_the_paper_models_have_their_published_sizes():
    known = known_models()
    qwen3b = known["Qwen/Qwen2.5-3B-Instruct"]
    # the model card: 3.09B parameters, 2.77B without the (tied) embeddings
    assert qwen3b.params == pytest.approx(3.09e9, rel=0.005)
    assert qwen3b.params - qwen3b.vocab * qwen3b.hidden == pytest.approx(2.77e9, rel=0.005)
    assert known["Qwen/Qwen2.5-7B-Instruct"].params == pytest.approx(7.62e9, rel=0.005)
    assert known["meta-llama/Llama-3.2-3B-Instruct"].params == pytest.approx(3.21e9, rel=0.005)


def test_a_local_model_folder_is_read_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 64,
                "num_hidden_layers": 3,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 128,
                "vocab_size": 1000,
                "tie_word_embeddings": False,
            }
        )
    )
    dims = model_dims(replace(tiny_cfg().model, name=str(tmp_path)))
    assert dims == ModelDims(64, 3, 4, 2, 128, 1000, tied=False, qkv_bias=True)


# --- memory arithmetic by hand ---------------------------------------------------------------------


def test_memory_parts_by_hand():
    """hidden 32, 2 layers, 4 heads of 8 (kv 2 x 8 = 16), ffn 64, vocab 104; float32, no autocast;
    P = 2 prompts x n = 8, m = 4, micro-batches of 4; prompts of 10 tokens, completions of 6."""
    cfg = tiny_cfg(
        prompts_per_step=2, selection={"rule": "max_variance", "n": 8, "m": 4}, optim={"micro_batch_size": 4}
    )
    dims = model_dims(cfg.model)
    hw = {"processes": 1, "device": "cpu", "accelerator": {"memory_gib": 1.0, "framework_overhead_gb": 0.5}}
    est = memory_estimate(cfg, dims, hw, Lengths(10, 6))
    params = 104 * 32 + 2 * (32 * 32 * 2 + 32 * 16 * 2 + 3 * 32 * 64 + 2 * 32) + 32
    assert dims.params == params
    parts = est["parts"]
    assert parts["weights"] == params * 4 and parts["gradients"] == params * 4
    assert parts["optimizer"] == 2 * params * 4 and parts["reference_model"] == 0
    # activations: 4 rows x 16 tokens; per block and token 2 x 4 x 32 + 4 x (5 x 32 + 3 x 16 + 4 x 64);
    # outside the blocks 4 x 4 x 32; log-prob logits 4 rows x 6 completion tokens x 104 x 16 bytes
    # (one chunk: fewer than logprob_chunk_tokens)
    tokens = 4 * 16
    block = 2 * 4 * 32 + 4 * (5 * 32 + 3 * 16 + 4 * 64)
    assert parts["activations"] == 2 * block * tokens + 4 * 4 * 32 * tokens + 4 * 6 * 104 * 16
    # float32 weights, no autocast: no cast copies; on CPU AdamW steps tensor by tensor
    assert parts["autocast_cache"] == 0 and parts["optimizer_step"] == 0
    # passes of 2 rows halve the blocks' activations and the logits; chunks of 5 tokens bound the logits
    halves = memory_estimate(replace(cfg, optim=replace(cfg.optim, rows_per_pass=2)), dims, hw, Lengths(10, 6))
    assert halves["parts"]["activations"] == (2 * block + 4 * 4 * 32) * 2 * 16 + 2 * 6 * 104 * 16
    chunked = memory_estimate(replace(cfg, optim=replace(cfg.optim, logprob_chunk_tokens=5)), dims, hw, Lengths(10, 6))
    assert chunked["parts"]["activations"] == 2 * block * tokens + 4 * 4 * 32 * tokens + 5 * 104 * 16
    # HF generate: one call of 16 rows, KV 2 x 2 layers x 16 x 4 bytes = 256 per token. The prefill
    # (16 x 10 prompt tokens: their KV + 4 bytes x (3 x 64 + 3 x 32)) outweighs the end of decoding
    # (KV of 16 x 16 tokens, one layer's copy more, 16 x 104 logits at 4 + 6 x 4 bytes)
    prefill = 16 * 10 * (256 + 4 * (3 * 64 + 3 * 32))
    decode = 256 * 16 * 16 + 256 * 16 * 16 // 2 + 16 * 104 * (4 + 6 * 4)
    assert prefill > decode and parts["engine"] == prefill
    persistent = parts["weights"] + parts["optimizer"]
    framework = int(0.5 * GIB)  # outside the allocator; on CPU no reserve and no NCCL
    assert parts["reserve"] == 0 and parts["nccl"] == 0
    assert est["phases"]["update"] == persistent + parts["gradients"] + parts["activations"]
    assert est["phases"]["generation"] == persistent + parts["engine"]
    assert est["peak"] == persistent + framework + max(parts["gradients"] + parts["activations"], parts["engine"])
    assert est["fits"] and est["floor"] == persistent + framework + max(parts["gradients"], parts["engine"])
    # on CUDA the multi-tensor AdamW's temporaries (one fp32 copy of the parameters) join the step
    cuda = memory_estimate(cfg, dims, {**hw, "device": "cuda"}, Lengths(10, 6))
    assert cuda["parts"]["optimizer_step"] == params * 4


def test_fsdp_by_hand():
    """optim.fsdp on 4 processes, bf16 compute: float32 weights, gradients and AdamW state 1/4 each, no
    autocast cache; the whole model gathered in bf16 while HF generates; in the update the root unit
    and two layers gathered (bf16) with their float32 gradients; a bf16 residual stream."""
    cfg = tiny_cfg(
        prompts_per_step=4,
        selection={"rule": "max_variance", "n": 8, "m": 4},
        optim={"micro_batch_size": 4, "fsdp": True},
        model={"name": "tiny", "tiny": TINY, "mixed_precision": "bf16"},
    )
    dims = model_dims(cfg.model)
    hw = {"processes": 4, "device": "cuda", "accelerator": {"memory_gib": 1.0, "framework_overhead_gb": 0.5}}
    parts = memory_estimate(cfg, dims, hw, Lengths(10, 6))["parts"]
    params, layer = dims.params, dims.layer_params
    assert parts["weights"] == params * 4 / 4 and parts["gradients"] == params * 4 / 4
    assert parts["optimizer"] == 2 * params * 4 / 4 and parts["optimizer_step"] == params * 4 / 4
    assert parts["autocast_cache"] == 0 and parts["gathered_weights"] == params * 2
    # the root unit and the layer in backward with bf16 gradients and float32 reduce-scatter inputs,
    # the previous layer's reduce-scatter input in flight, the next layer prefetched (bf16)
    root = params - 2 * layer
    assert parts["gathered_units"] == (root + layer) * (2 + 2 + 4) + layer * (4 + 2)
    # on CUDA the allocator's reserve (10 % of the largest phase) and, with 4 processes, NCCL's buffers
    est = memory_estimate(cfg, dims, hw, Lengths(10, 6))
    assert parts["nccl"] == GIB and parts["reserve"] == math.ceil(0.1 * max(est["phases"].values()))
    assert est["peak"] == max(est["phases"].values()) + parts["reserve"] + int(0.5 * GIB) + GIB
    # one prompt per process: 4 rows of 16 tokens; r = c = 2
    tokens = 4 * 16
    block = 2 * 2 * 32 + 2 * (5 * 32 + 3 * 16 + 4 * 64)
    assert parts["activations"] == 2 * block * tokens + 4 * 2 * 32 * tokens + 4 * 6 * 104 * 18
    # the same config on one process is not sharded
    one = memory_estimate(cfg, dims, {**hw, "processes": 1}, Lengths(10, 6))["parts"]
    assert one["weights"] == params * 4 and one["gathered_weights"] == 0 and one["autocast_cache"] == params * 2


def test_lora_sharding_checkpointing_and_vllm_by_hand():
    cfg = config_from_dict(
        {
            "model": {
                "name": "Qwen/Qwen2.5-3B-Instruct",
                "dtype": "bfloat16",
                "mixed_precision": "bf16",
                "gradient_checkpointing": True,
            },
            "lora": {"enabled": True, "r": 64, "target_modules": ["q_proj", "v_proj"]},
            "engine": {"name": "vllm", "options": {"gpu_memory_utilization": 0.5}},
            "prompts_per_step": 1,
            "selection": {"rule": "all", "n": 16, "m": 16},
            "optim": {"micro_batch_size": 4, "shard_optimizer_state": True},
            "budget": {"max_steps": 1},
        }
    )
    dims = known_models()["Qwen/Qwen2.5-3B-Instruct"]
    hw = {"processes": 1, "device": "cuda", "accelerator": {"memory_gib": 40.0, "framework_overhead_gb": 1.0}}
    est = memory_estimate(cfg, dims, hw, Lengths(100, 200))
    lora = 36 * 64 * ((2048 + 2048) + (2048 + 256))
    assert est["trainable_params"] == lora
    parts = est["parts"]
    assert parts["weights"] == dims.params * 2 + lora * 4
    assert parts["optimizer"] == 2 * lora * 4  # one process: nothing to shard
    assert parts["engine"] == int(0.5 * 40 * GIB)
    # gradient checkpointing: each block's bf16 input + one block's full set, bf16 residual (r = c = 2)
    tokens = 4 * 300
    block = 2 * 2 * 2048 + 2 * (5 * 2048 + 3 * 256 + 4 * 11008)
    logits = 4 * 200 * 151936 * 18  # the 4 x 200 completion tokens fit one chunk (logprob_chunk_tokens 1024)
    assert parts["activations"] == 36 * 2 * 2048 * tokens + block * tokens + 4 * 2 * 2048 * tokens + logits
    assert parts["autocast_cache"] == 0  # bf16 weights: nothing to cast
    assert parts["optimizer_step"] == lora * 4
    # vLLM's share is held beside the update; on CUDA the allocator's reserve of 10 % joins the peak
    allocated = parts["weights"] + parts["optimizer"] + parts["gradients"] + parts["activations"] + parts["engine"]
    assert est["phases"]["update"] == allocated and parts["reserve"] == math.ceil(0.1 * allocated)
    assert est["peak"] == allocated + parts["reserve"] + GIB and parts["nccl"] == 0  # one process: no NCCL
    # KV room: the share less vLLM's bf16 weights, over 2 x 36 x 256 x 2 bytes x 300 tokens a sequence
    assert est["concurrent_sequences"] == min(256, (int(20 * GIB) - dims.params * 2) // (2 * 36 * 256 * 2 * 300))
    two = memory_estimate(cfg, dims, {**hw, "processes": 2}, Lengths(100, 200))
    assert two["parts"]["optimizer"] == math.ceil(2 * lora * 4 / 2)


# What both measurement scripts start with: the spec (argv[1]), its model dimensions, the peak reader.
MEASURE_PREAMBLE = """
import re, sys, json, torch
from pods_bench.config import config_from_dict
from pods_bench.planning.architecture import ModelDims
from pods_bench.planning.memory import Lengths
torch.set_num_threads(1)
spec = json.loads(sys.argv[1])
h, layers, vocab, rows, P, C = (spec[k] for k in ("hidden", "layers", "vocab", "rows", "prompt", "completion"))
dims = ModelDims(h, layers, 4, 2, 3 * h, vocab)
torch.manual_seed(0)
status = lambda key: int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
"""

MEASURE = (
    MEASURE_PREAMBLE
    + """
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, LlamaConfig, get_scheduler
from pods_bench import update as U
from pods_bench.planning.memory import activation_bytes
model = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
    num_attention_heads=4, num_key_value_heads=2, intermediate_size=3 * h, tie_word_embeddings=True))
cfg = config_from_dict({"selection": {"rule": "all", "n": rows, "m": rows}, "prompts_per_step": 1, "device": "cpu",
    "optim": {"micro_batch_size": rows, "logprob_chunk_tokens": spec.get("chunk", 1024)}, "budget": {"max_steps": 1},
    "model": {"gradient_checkpointing": spec["checkpointing"]}})
if spec["checkpointing"]:
    model.gradient_checkpointing_enable()
accelerator = Accelerator(cpu=True)
model = accelerator.prepare(model)
optimizer = U.make_optimizer(model, cfg, 1)
learner = U.Learner(model, model, None, optimizer, get_scheduler("constant", optimizer), accelerator, 0)
g = torch.Generator().manual_seed(0)
seqs = [U.KeptRollout(torch.randint(1, vocab, (P,), generator=g).tolist(), torch.randint(1, vocab, (C,), generator=g).tolist(),
        float(i % 2) - 0.5) for i in range(rows)]
U.update_policy(learner, seqs, cfg)  # the optimizer state exists from here on
optimizer.zero_grad(set_to_none=True)
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the current RSS
U.update_policy(learner, seqs, cfg)
measured = status("VmHWM") - before
predicted = activation_bytes(cfg, dims, rows, Lengths(P, C)) + dims.params * 4  # + the gradients
print(json.dumps({"measured": measured, "predicted": predicted}))
"""
)


LOGITS_HEAVY = {"hidden": 64, "layers": 1, "vocab": 32000, "rows": 8, "prompt": 16, "completion": 256}


def measure_update(spec: dict) -> dict:
    """Measured and planned peak of a real update (MEASURE) in a fresh process; a spec already
    measured in this test session is not measured again (the chunk test below reuses two)."""
    return dict(_measure_update_once(json.dumps(spec, sort_keys=True)))


@functools.cache
def _measure_update_once(spec_json: str) -> tuple:
    return tuple(measure(MEASURE, json.loads(spec_json)).items())


def measure(script: str, spec: dict) -> dict:
    """{"measured", "predicted"} printed by a measurement script run in a fresh process. glibc's mmap
    threshold is fixed, so that freed blocks go back to the system and the resident set follows
    what torch holds."""
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


needs_peak_reset = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset"
)


@needs_peak_reset
@pytest.mark.parametrize(
    "spec",
    [
        {"hidden": 256, "layers": 4, "vocab": 104, "rows": 64, "prompt": 64, "completion": 64, "checkpointing": False},
        {"hidden": 256, "layers": 4, "vocab": 104, "rows": 64, "prompt": 64, "completion": 64, "checkpointing": True},
        {**LOGITS_HEAVY, "checkpointing": False, "chunk": 4096},
        {**LOGITS_HEAVY, "checkpointing": False, "chunk": 256},
    ],
    ids=["blocks", "checkpointed", "logits-one-chunk", "logits-chunked"],
)
def test_update_memory_is_within_25_percent_of_the_measured_peak(spec):
    """The update's peak above the resting process (activations, logits, gradients), measured as the
    resident-set high-water mark of a real update (the second one: AdamW's state exists), against
    the planner's count."""
    result = measure_update(spec)
    assert result["measured"] > 50 * 2**20  # large enough to be more than allocator noise
    assert result["measured"] == pytest.approx(result["predicted"], rel=0.25), result


@needs_peak_reset
def test_log_prob_chunks_save_the_memory_the_plan_says():
    """A vocabulary-heavy update (32,000 entries, 2,048 completion tokens) with the log-probs taken
    in one chunk and in chunks of 256 tokens: the measured peak drops by the planned amount (the
    logits of 1,792 token positions, 16 bytes each entry: 0.92 GB)."""
    whole = measure_update({**LOGITS_HEAVY, "checkpointing": False, "chunk": 4096})
    chunked = measure_update({**LOGITS_HEAVY, "checkpointing": False, "chunk": 256})
    planned = whole["predicted"] - chunked["predicted"]
    assert planned == (2048 - 256) * 32000 * 16
    assert whole["measured"] - chunked["measured"] == pytest.approx(planned, rel=0.25), (whole, chunked)


MEASURE_GENERATE = (
    MEASURE_PREAMBLE
    + """
from dataclasses import replace
from pods_bench.engines.base import SamplingConfig
from pods_bench.engines.hf import HFEngine
from pods_bench.models import TokenIdTokenizer, build_random_model
from pods_bench.planning.memory import hf_generation_bytes
engine = HFEngine(build_random_model(dims, "float32", "cpu"), TokenIdTokenizer(vocab), max_batch=rows)
# rows of distinct prompts (an evaluation call: every row its own prefill), or n rows of one prompt
# (a training call: one prefill, copied to the rows)
prompt = lambda k: " ".join(str(1 + (i + k) % (vocab - 1)) for i in range(P))
prompts, n = ([prompt(k) for k in range(rows)], 1) if spec.get("distinct_prompts") else ([prompt(0)], rows)
sampling = SamplingConfig(temperature=0.9, top_p=1.0, top_k=50, max_new_tokens=C, seed=0)  # the 8-GPU recipe's
engine.generate(prompts, n, replace(sampling, max_new_tokens=min(C, 4)))  # first-call allocations
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the current RSS
engine.generate(prompts, n, sampling)
measured = status("VmHWM") - before
cfg = config_from_dict({"device": "cpu", "budget": {"max_steps": 1}})
print(json.dumps({"measured": measured, "predicted": hf_generation_bytes(cfg, dims, rows, Lengths(P, C))}))
"""
)


@needs_peak_reset
@pytest.mark.parametrize(
    "spec",
    [
        {
            "hidden": 256,
            "layers": 2,
            "vocab": 104,
            "rows": 64,
            "prompt": 256,
            "completion": 8,
            "distinct_prompts": True,
        },
        {"hidden": 64, "layers": 1, "vocab": 32000, "rows": 128, "prompt": 8, "completion": 32},
        {"hidden": 128, "layers": 4, "vocab": 1000, "rows": 64, "prompt": 32, "completion": 512},
    ],
    ids=["prefill", "decode-temporaries", "kv-cache"],
)
def test_hf_generation_memory_is_within_15_percent_of_the_measured_peak(spec):
    """One HF generate call through the engine (float32 on CPU, the recipe's temperature and top-k),
    its resident-set high-water mark above the resting process against hf_generation_bytes: a call
    whose prefill dominates (distinct prompts, as an evaluation's: a training call's rows share one
    prefill, which the plan's prefill of every row bounds), one whose decode step's vocabulary-wide
    temporaries dominate, one whose KV cache does (these two: one prompt's n rows, a training call)."""
    result = measure(MEASURE_GENERATE, spec)
    assert result["measured"] > 50 * 2**20  # large enough to be more than allocator noise
    assert result["predicted"] == pytest.approx(result["measured"], rel=0.15), result


# --- the fit check and the plan ----------------------------------------------------------------------


def test_a_config_that_cannot_fit_is_refused_and_one_that_may_not_is_warned():
    base = {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "mixed_precision": "bf16"},
        "selection": {"rule": "all", "n": 16, "m": 16},
        "prompts_per_step": 1,
        "budget": {"max_steps": 1},
        "task": {"max_prompt_tokens": 256},
        "sampling": {"max_new_tokens": 256},
    }
    l40s = hardware_setup("l40s")
    full = config_from_dict(base)  # float32 weights + grads + AdamW: 16 bytes x 7.6B params
    with pytest.raises(PodsBenchError) as e:
        check_fits({"full": full}, l40s, "l40s")
    assert str(e.value).startswith("arm full cannot fit on l40s: weights, optimizer state, gradients")
    assert "\n" not in str(e.value)
    lora = config_from_dict(
        {
            **base,
            "model": {**base["model"], "dtype": "bfloat16"},
            "lora": {"enabled": True},
            "optim": {"micro_batch_size": 16},
        }
    )
    warnings = check_fits({"lora": lora}, l40s, "l40s")
    assert len(warnings) == 1 and warnings[0].startswith("arm lora may run out of memory on l40s")
    small = config_from_dict(
        {
            **base,
            "model": {**base["model"], "dtype": "bfloat16"},
            "lora": {"enabled": True},
            "optim": {"micro_batch_size": 2},
        }
    )
    assert check_fits({"small": small}, l40s, "l40s") == []


def test_the_workflow_stops_on_a_config_that_cannot_fit(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / "config" / "math_main.yaml").read_text())
    config["train"] = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct", "dtype": "float32"}, "lora": {"enabled": False}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--snakefile",
            str(ROOT / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.startswith("pods-bench workflow:")]
    assert len(lines) == 1 and "cannot fit on l40s" in lines[0], out.stderr
    assert not (tmp_path / "results").exists()


def test_plan_of_the_paper_setting_fits_and_orders_the_arms():
    rows, name = plan(ROOT / "config" / "gsm8k_n_scaling.yaml")
    assert name == "l40s" and all(r["fits"] for r in rows)
    steps = [r["step_s"] for r in rows]  # m = 16 throughout: only generation grows with n
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert len({r["time_update_s"] for r in rows}) == 1
    on_h200, _ = plan(ROOT / "config" / "gsm8k_n_scaling.yaml", "h200")
    assert all(h["step_s"] < r["step_s"] for h, r in zip(on_h200, rows))
    with pytest.raises(PodsBenchError, match="not a multiple of the 8 processes of h100x8"):
        plan(ROOT / "config" / "gsm8k_n_scaling.yaml", "h100x8")  # one prompt a step cannot be split 8 ways


def plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pods_bench", "plan", str(ROOT / "config" / "smoke.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_the_8_gpu_recipes_fit_80_gb_with_a_tenth_to_spare():
    """Every arm of the 8-GPU configs, counted with the ZeRO-2 layout, HF generate's prefill and decode
    temporaries, the allocator's reserve and NCCL, stays under 60 GiB (h100x8) and 72 GiB (a100x8, 10 %
    below 80 GB); a100x8 only with its two generate calls of 256 rows: one call of 512 would not fit."""
    for config, bound in (("h100x8", 60), ("a100x8", 72)):
        rows, _ = plan(ROOT / "config" / f"{config}.yaml")
        assert rows and all(r["mem_peak_gib"] <= bound for r in rows), [(r["arm"], r["mem_peak_gib"]) for r in rows]
        assert all(r["mem_reserve_gib"] > 0 and r["mem_nccl_gib"] == 1.0 for r in rows)
    experiment, hardware = load_experiment(ROOT / "config" / "a100x8.yaml")
    _, arms = resolve_runs(experiment, hardware)
    cfg = arms["grpo_n32_m32"]
    assert cfg.engine.max_batch == 256
    one_call = replace(cfg, engine=replace(cfg.engine, max_batch=512))
    assert not memory_estimate(one_call, model_dims(one_call.model), hardware)["fits"]


def test_plan_cli_writes_its_csv_and_reports_the_source(tmp_path):
    import pandas as pd

    out = plan_cli("--out", str(tmp_path / "p.csv"))
    assert out.returncode == 0, out.stderr
    assert "step times: hardware profile" in out.stdout and "| pods_n16_m8 | 16/8 |" in out.stdout
    table = pd.read_csv(tmp_path / "p.csv")
    assert list(table["arm"]) == ["grpo_n16_m16", "pods_n16_m8"] and table["fits"].all()
    bad = plan_cli("--model", str(tmp_path / "no.json"))
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "does not exist" in bad.stderr


# --- the step-time model -----------------------------------------------------------------------------


def test_step_features_by_hand():
    cfg = tiny_cfg(
        prompts_per_step=8,
        selection={"rule": "max_variance", "n": 64, "m": 8},
        engine={"max_batch": 256},
        optim={"micro_batch_size": 16},
    )
    f = step_features(cfg, 1, StepLengths(decode_width=30, completion_mean=12, update_width=70))
    # 512 rows in 2 calls of 30 steps; 64 kept rows in 4 micro-batches of 70 tokens a row
    assert f == {
        "decode_steps": 60,
        "decode_sequence_steps": 512 * 30,
        "rollouts_generated": 512,
        "micro_batches": 4,
        "update_tokens": 64 * 70,
    }
    two = step_features(cfg, 2, StepLengths(30, 12, 70))
    assert two["rollouts_generated"] == 256 and two["decode_steps"] == 30


def test_fit_recovers_the_coefficients_of_synthetic_steps():
    import numpy as np

    truth = {
        "gen": {"1": 0.05, "decode_steps": 0.004, "decode_sequence_steps": 2e-5},
        "reward": {"1": 0.01, "rollouts_generated": 3e-4},
        "select": {"1": 0.001, "rollouts_generated": 1e-6},
        "update": {"1": 0.02, "micro_batches": 0.03, "update_tokens": 1e-4},
        "sync": {"1": 0.0},
    }
    model = StepTimeModel(truth)
    rng = np.random.default_rng(0)
    records = []
    for n, m in [(16, 16), (64, 8), (32, 4)] * 5:
        width = float(rng.integers(20, 33))
        f = {
            "decode_steps": width * (1 + n // 32),
            "decode_sequence_steps": 8 * n * width,
            "rollouts_generated": 8 * n,
            "micro_batches": 1 + (8 * m) // 64,
            "update_tokens": 8 * m * (60 + width),
        }
        times = model.phase_seconds(f)
        records.append(
            {
                **f,
                **{f"time_{p}_s": t for p, t in times.items()},
                "completion_len_mean": width / 2,
                "prompts_kept": 8,
                "m": m,
            }
        )
    fitted = fit(records)
    for phase, names in PHASE_FEATURES.items():
        for name in names:
            assert fitted.coefficients[phase][name] == pytest.approx(truth[phase].get(name, 0.0), rel=1e-6, abs=1e-9)
    again = StepTimeModel.from_dict(json.loads(json.dumps(fitted.to_dict())))
    cfg = tiny_cfg(prompts_per_step=8, selection={"rule": "max_variance", "n": 32, "m": 4})
    assert predict(again, cfg)["step"] == pytest.approx(predict(fitted, cfg)["step"])


def test_hardware_profile_coefficients_follow_the_datasheet():
    cfg = config_from_dict(
        {
            "model": {"name": "Qwen/Qwen2.5-3B-Instruct", "dtype": "bfloat16", "mixed_precision": "bf16"},
            "lora": {"enabled": True},
            "budget": {"max_steps": 1},
        }
    )
    dims = known_models()["Qwen/Qwen2.5-3B-Instruct"]
    from pods_bench.planning.step_time import from_hardware

    l40s, h100 = hardware_setup("l40s"), hardware_setup("h100x8")
    a, b = from_hardware(cfg, dims, l40s), from_hardware(cfg, dims, h100)
    # a decoding step reads the bf16 weights once at half the bandwidth
    assert a.coefficients["gen"]["decode_steps"] == pytest.approx(2 * dims.params / (864e9 * 0.5))
    # LoRA without checkpointing: 4 x params FLOPs a token at 35 % of the bf16 peak
    assert a.coefficients["update"]["update_tokens"] == pytest.approx(4 * dims.params / (181e12 * 0.35))
    assert b.coefficients["update"]["update_tokens"] < a.coefficients["update"]["update_tokens"]


# --- the training job's wall time ---------------------------------------------------------------


def trainer_schedule(cfg, step_s: float) -> tuple[int, int]:
    """(steps, checkpoints) of a run whose steps all take step_s, counted by the trainer's own Progress."""
    from pods_bench.train import Progress

    p = Progress(checkpoint_step=0, checkpoint_clock=0.0)
    checkpoints = 1  # step 0's
    while p.budget_reached(cfg) is None:
        p.clock, p.step = p.clock + step_s, p.step + 1
        if p.checkpoint_due(cfg):
            checkpoints, p.checkpoint_step, p.checkpoint_clock = checkpoints + 1, p.step, p.clock
    return p.step, checkpoints + (p.checkpoint_step != p.step)


@pytest.mark.parametrize(
    "budget, step_s",
    [
        ({"max_train_time_s": 1800, "checkpoint_every_s": 120}, 221.6),  # a step passes one multiple or two
        ({"max_train_time_s": 1800, "checkpoint_every_s": 120}, 36.9),
        ({"max_train_time_s": 100, "checkpoint_every_s": 60, "checkpoint_every_steps": 4}, 7.0),
        ({"max_steps": 10, "checkpoint_every_s": 3600, "checkpoint_every_steps": 3}, 1.0),  # + the end point
    ],
)
def test_the_job_schedule_counts_steps_and_checkpoints_as_the_trainer(budget, step_s):
    from pods_bench.planning.job_time import schedule

    cfg = tiny_cfg(budget=budget)
    run = schedule(cfg, step_s)
    assert (run.steps, run.checkpoints) == trainer_schedule(cfg, step_s)
    assert run.train_s == pytest.approx(run.steps * step_s)


def eight_gpu_arms(config: str):
    """Every arm of an 8-GPU experiment config as the workflow resolves it, with its hardware setup."""
    from pods_bench.experiment import load_experiment, resolve_runs

    experiment, hardware = load_experiment(ROOT / "config" / config)
    return resolve_runs(experiment, hardware)[1], hardware, experiment.hardware


def test_the_job_wall_time_adds_up_and_flips_the_verdict_when_the_limit_is_too_short():
    """a100x8's PODS arm: every step is longer than the 120 s between checkpoints, so each step is
    followed by a checkpoint and an evaluation of GSM8K's 1319 test problems, 165 a process."""
    from pods_bench.planning.plan import job_verdict_line, plan_arm
    from pods_bench.planning.step_time import from_hardware

    arms, hardware, name = eight_gpu_arms("a100x8.yaml")
    cfg = arms["pods_n128_m32"]
    row = plan_arm("pods_n128_m32", cfg, hardware, name)
    # the parts: steps until the clock passes 30 minutes; a checkpoint after each and at step 0
    assert row["steps"] == math.ceil(1800 / row["step_s"]) and row["step_s"] > 120
    assert row["checkpoints"] == row["evaluations"] == row["steps"] + 1
    assert row["train_s"] == pytest.approx(row["steps"] * row["step_s"], abs=0.1)
    # one evaluation: the largest slice (ceil(1319 / 8) rows) in one generate call of 1024 steps, graded
    coefficients = from_hardware(cfg, model_dims(cfg.model), hardware).coefficients
    rows = math.ceil(1319 / 8)
    gen = coefficients["gen"]["decode_steps"] * 1024 + coefficients["gen"]["decode_sequence_steps"] * rows * 1024
    assert row["eval_s"] == pytest.approx(gen + coefficients["reward"]["rollouts_generated"] * rows, abs=0.01)
    assert row["eval_problems"] == 1319 and row["eval_one_process_s"] > 5 * row["eval_s"]  # 3 calls of <= 512
    # a checkpoint: float32 weights and two AdamW moments of Qwen2.5-7B at 1 GB/s
    assert row["checkpoint_s"] == pytest.approx(12 * model_dims(cfg.model).params / 1e9, abs=0.01)
    parts = row["train_s"] + row["evaluations"] * row["eval_s"] + row["checkpoints"] * row["checkpoint_s"]
    assert row["job_min"] == pytest.approx(parts / 60, abs=0.06)
    # the limit is the workflow's: 30 min x runtime_factor 1.5 + 60 min
    assert row["limit_min"] == 105 and row["job_fits"] and job_verdict_line(row) is None
    # too short a limit, from the setup or from the experiment config's resources: the verdict flips
    short = {**hardware, "train": {**hardware["train"], "runtime_overhead_min": row["job_min"] - 45 - 1}}
    tight = plan_arm("pods_n128_m32", cfg, short, name)
    assert tight["limit_min"] < tight["job_min"] and tight["job_fits"] is False
    assert "may outlast its job" in job_verdict_line(tight)
    given = plan_arm("pods_n128_m32", cfg, hardware, name, resources={"train": {"runtime_min": 40}})
    assert given["limit_min"] == 40 and given["job_fits"] is False
    assert {k: v for k, v in given.items() if k not in ("limit_min", "job_fits")} == {
        k: v for k, v in row.items() if k not in ("limit_min", "job_fits")
    }


@pytest.mark.parametrize("config", ["h100x8", "a100x8"])
def test_every_8_gpu_arm_fits_its_job_with_the_evaluation_shared(config):
    """And docs/cost-model.md's table of them is what the plan says (rank 0 alone: the job with
    eval_one_process_s instead)."""
    from pods_bench.planning.plan import plan_arm

    doc = (ROOT / "docs" / "cost-model.md").read_text(encoding="utf-8")
    arms, hardware, name = eight_gpu_arms(f"{config}.yaml")
    for arm, cfg in arms.items():
        r = plan_arm(arm, cfg, hardware, name)
        assert r["job_fits"], (arm, r["job_min"], r["limit_min"])
        alone = (r["train_s"] + r["evaluations"] * r["eval_one_process_s"] + r["checkpoints"] * r["checkpoint_s"]) / 60
        cells = [config, arm, round(r["step_s"], 1), r["steps"], r["evaluations"], round(r["eval_one_process_s"], 1)]
        cells += [round(r["eval_s"], 1), round(r["checkpoint_s"], 1), round(alone, 1), r["job_min"], r["limit_min"]]
        assert "| " + " | ".join(str(c) for c in cells) + " |" in doc


def test_the_published_l40s_calibration_matches_the_doc():
    """docs/cost-model.md (b) publishes the calibrated model's predictions; they are recomputed here
    from the logs in ../shared, so the page cannot drift from the code."""
    from pods_bench.planning.step_time_fit import published_l40s

    logs = published_logs()
    rows, model = published_l40s(
        logs, ROOT / "config" / "gsm8k_n_scaling.yaml", ROOT / "config" / "gsm8k_m_scaling.yaml"
    )
    fitted = {(r["n"], r["m"]): r for r in rows if r["role"] == "fitted"}
    assert set(fitted) == {(16, 16), (64, 16)}
    assert all(r["predicted_s"] == pytest.approx(r["measured_s"], abs=1e-3) for r in fitted.values())
    doc = (ROOT / "docs" / "cost-model.md").read_text(encoding="utf-8")
    section = doc[doc.index("### (b)") : doc.index("## Not done yet")]
    for r in rows:
        cells = f"| {r['n']}/{r['m']} | {r['role']} |"
        line = next((line for line in section.splitlines() if line.startswith(cells)), None)
        assert line is not None, cells
        values = [c.strip() for c in line.strip("|").split("|")][2:]
        assert [float(v) for v in values[1:]] == pytest.approx(
            [r["predicted_s"], r["gen_s"], r["update_s"]], abs=0.006
        )
    # more rollouts cost more; fewer trained rollouts cost less
    by = {(r["n"], r["m"]): r["predicted_s"] for r in rows}
    assert by[(16, 16)] < by[(32, 16)] < by[(64, 16)] < by[(128, 16)] < by[(256, 16)]
    assert by[(64, 2)] < by[(64, 4)] < by[(64, 8)] < by[(64, 16)]


@pytest.mark.parametrize(
    "folder, config, tolerance_pct, held_out",
    [
        # (a): the smoke task's character model; the page claims 20 %
        (
            "cost-model-results",
            "cost_model.yaml",
            20,
            {"held out: n, m", "held out: sampling.max_new_tokens=16", "held out: optim.micro_batch_size=4"},
        ),
        # (c): SmolLM2-135M-Instruct with LoRA, the replication's arms fitted; the page's claim is 20 %
        # (the 10 % aimed for holds for 3 of the 4 other (n, m): docs/cost-model.md (c))
        (
            "cost-model-results/smollm2",
            "cost_model_smollm2.yaml",
            20,
            {"held out: n, m", "held out: sampling.max_new_tokens=32"},
        ),
    ],
    ids=["smoke-model", "smollm2"],
)
def test_the_cpu_validation_is_the_committed_profile(folder, config, tolerance_pct, held_out):
    """docs/cost-model.md's tables are what `pods-bench profile` wrote into docs/<folder>/, and every
    prediction in them follows from the committed model and the config; the arms it was checked on
    include other (n, m) and settings than the two fitted, each within the page's tolerance."""
    import pandas as pd

    from pods_bench.planning.profile import arm_configs, validation_markdown

    results = ROOT / "docs" / folder
    rows = pd.read_csv(results / "validation.csv").to_dict("records")
    table = (results / "validation.md").read_text(encoding="utf-8")
    assert table == validation_markdown(rows)
    assert table in (ROOT / "docs" / "cost-model.md").read_text(encoding="utf-8")
    model = StepTimeModel.from_dict(json.loads((results / "step_time_model.json").read_text()))
    arms = arm_configs(ROOT / "config" / config, Path("unused"), check_model=False)
    assert [r["arm"] for r in rows] == list(arms)
    for r in rows:
        settings, overrides, _ = arms[r["arm"]]
        cfg = config_from_dict(settings, [*overrides, "budget.max_steps=1"])
        assert predict(model, cfg)["step"] == pytest.approx(r["predicted_s"], abs=1e-4), r["arm"]
        # the error is relative to the measurement, recomputed rather than read
        error = 100 * (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
        assert r["error_pct"] == pytest.approx(error, abs=0.051), r["arm"]
        own = 100 * (r["predicted_own_lengths_s"] - r["measured_s"]) / r["measured_s"]
        assert r["error_own_lengths_pct"] == pytest.approx(own, abs=0.051), r["arm"]
        # other (n, m) are predicted from the config alone; another setting (completion limit, micro-batch)
        # from the arm's own lengths: the fitted arms' lengths cannot tell how long completions get
        assert abs(error if r["role"] in ("fitted", "held out: n, m") else own) < tolerance_pct, r["arm"]
    assert held_out <= {r["role"] for r in rows} - {"fitted"}
    assert sum(r["role"] == "fitted" for r in rows) == 2


def test_the_smollm2_update_memory_is_the_committed_measurement():
    """docs/cost-model.md (c): SmolLM2's measured update memory per arm (`pods-bench profile --memory`)
    beside the plan's count, which follows from the config; every arm within 15 % of its measured peak."""
    import pandas as pd

    from pods_bench.planning.measure_memory import planned_update_bytes
    from pods_bench.planning.profile import arm_configs, memory_markdown

    results = ROOT / "docs" / "cost-model-results" / "smollm2"
    rows = pd.read_csv(results / "memory.csv").to_dict("records")
    table = (results / "memory.md").read_text(encoding="utf-8")
    assert table == memory_markdown(rows)
    assert table in (ROOT / "docs" / "cost-model.md").read_text(encoding="utf-8")
    arms = arm_configs(ROOT / "config" / "cost_model_smollm2.yaml", Path("unused"), check_model=False)
    assert [r["arm"] for r in rows] == list(arms)
    for r in rows:
        settings, overrides, _ = arms[r["arm"]]
        cfg = config_from_dict(settings, [*overrides, "budget.max_steps=1"])
        assert planned_update_bytes(cfg) / 2**20 == pytest.approx(r["planned_mib"], abs=0.1), r["arm"]
        error = 100 * (r["planned_mib"] - r["measured_mib"]) / r["measured_mib"]
        assert r["error_pct"] == pytest.approx(error, abs=0.051), r["arm"]
        assert abs(error) < 15, r["arm"]  # the plan within 15 % of the measured peak


# --- the what-if projection --------------------------------------------------------------------------


def published_logs() -> Path:
    """The paper's logs in the data folder; a mis-set folder fails (as the data fixture does), never skips."""
    logs = Path(os.environ.get("PODS_BENCH_DATA_DIR", ROOT.parent / "shared" / "data")) / "pods-paper-logs"
    if not logs.is_dir():
        pytest.fail(f"no published logs at {logs}; set PODS_BENCH_DATA_DIR to the data folder")
    return logs


def test_projection_onto_the_same_step_times_gives_back_the_measurement(tmp_path):
    """With a step-time model that reproduces the measured step times (the calibrated L40S model),
    the projection must return the measured times to T and speedups; onto the H200's datasheet
    model each arm's time scales by its step-time ratio."""
    from pods_bench.planning.project import project
    from pods_bench.planning.step_time_fit import published_l40s

    logs = published_logs()
    config = ROOT / "config" / "gsm8k_main.yaml"
    _, model = published_l40s(logs, ROOT / "config" / "gsm8k_n_scaling.yaml", ROOT / "config" / "gsm8k_m_scaling.yaml")
    (tmp_path / "model.json").write_text(json.dumps(model.to_dict()))
    same = project(logs, config, "l40s", tmp_path / "model.json", only=["gsm8k-l40s-qwen"])
    assert [r["arm"] for r in same] == ["GRPO", "PODS n=64 m=16"]
    for r in same:
        assert r["projected_s_per_step"] == pytest.approx(r["measured_s_per_step"], abs=1e-3)
        assert r["projected_t_to_T_s"] == pytest.approx(r["measured_t_to_T_s"], rel=1e-3)
        assert r["projected_speedup"] == pytest.approx(r["measured_speedup"], rel=1e-3)
    assert same[1]["measured_speedup"] > 1.7  # the paper's claim on this setting
    h200 = project(logs, config, "h200", only=["gsm8k-l40s-qwen"])
    grpo, pods = h200
    ratio = lambda r: r["projected_s_per_step"] / r["measured_s_per_step"]
    assert pods["projected_t_to_T_s"] == pytest.approx(pods["measured_t_to_T_s"] * ratio(pods), rel=1e-3)
    assert pods["projected_speedup"] == pytest.approx(pods["measured_speedup"] * ratio(grpo) / ratio(pods), rel=1e-3)
    low, high = pods["projected_speedup_ci_low"], pods["projected_speedup_ci_high"]
    assert low < pods["projected_speedup"] < high


def test_projection_refuses_a_setup_the_config_cannot_run_on():
    from pods_bench.planning.project import project

    with pytest.raises(PodsBenchError) as e:
        project(published_logs(), ROOT / "config" / "gsm8k_main.yaml", "h100x8", only=["gsm8k-l40s-qwen"])
    assert str(e.value) == (
        "config key prompts_per_step (1) is not a multiple of the 8 processes of h100x8: the config cannot run there as it is"
    )
