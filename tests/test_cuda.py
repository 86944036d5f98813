"""The CUDA code path, on a GPU only (marker `cuda`; skipped elsewhere, run by `make gpu-check`):
sampling log-probs equal the trainer's under bf16 autocast, a short run trains on the GPU, and
full fine-tuning keeps float32 master weights there."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_sampling_logprobs_equal_the_trainers_on_cuda():
    from pods_bench.config import config_from_dict
    from pods_bench.engines.base import SamplingConfig
    from pods_bench.engines.hf import HFEngine
    from pods_bench.models import build_char_tokenizer, build_tiny_model
    from pods_bench.update import KeptRollout, completion_logprobs, pack

    cfg = config_from_dict({"model": {"name": "tiny"}, "budget": {"max_steps": 1}, "device": "cuda"})
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(cfg.model.tiny, tokenizer).to("cuda")
    engine = HFEngine(model, tokenizer, autocast_dtype=torch.bfloat16)
    out = engine.generate(["What is 2 + 3?"], 8, SamplingConfig(temperature=1.0, max_new_tokens=16, seed=0))
    rows = [KeptRollout(out.prompt_ids[0], c, 0.0) for c in out.completion_ids[0]]
    batch = pack(rows, tokenizer.pad_token_id, torch.device("cuda"))
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        trainer = completion_logprobs(model, batch, 1.0)
    for i, lps in enumerate(out.logprobs[0]):
        assert trainer[i, : len(lps)].float().cpu() == pytest.approx(torch.tensor(lps), abs=0.05)


def test_a_short_run_trains_on_the_gpu_with_float32_master_weights(tmp_path):
    from pods_bench.checkpoint import latest_checkpoint
    from pods_bench.config import config_from_dict
    from pods_bench.train import train

    cfg = config_from_dict(
        {
            "device": "cuda",
            "output_dir": str(tmp_path / "run"),
            "model": {"name": "tiny", "dtype": "float32", "mixed_precision": "bf16"},
            "task": {"name": "arith", "system_prompt": ""},
            "selection": {"rule": "max_variance", "n": 8, "m": 4},
            "sampling": {"temperature": 1.0, "max_new_tokens": 16},
            "optim": {"lr": 1e-3},
            "budget": {"max_steps": 3, "checkpoint_every_s": 1e9},
            "eval": {"inline": False, "benchmarks": ["arith"]},
        }
    )
    train(cfg, progress=False)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["status"] == "finished" and run["hardware"]["gpus"]
    from safetensors.torch import load_file

    weights = load_file(str(next((latest_checkpoint(tmp_path / "run") / "model").glob("*.safetensors"))))
    assert all(t.dtype == torch.float32 for t in weights.values())
    # the allocator was configured for the run, and every step logged its peaks by phase
    assert run["hardware"]["cuda_allocator"] in (os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "expandable_segments:True")
    for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines():
        step = json.loads(line)
        for phase in ("gen", "update", "sync"):
            allocated, reserved = step[f"peak_allocated_{phase}_gib"], step[f"peak_reserved_{phase}_gib"]
            assert 0 < allocated <= reserved, (phase, allocated, reserved)


# --- what the GPU check (pods_bench/gpu_check.py) reads from the device --------------------------------


def test_capacity_is_what_the_device_reports():
    from pods_bench.gpu_check import hardware_for

    _, hardware = hardware_for("cuda")
    free, total = torch.cuda.mem_get_info(0)
    assert hardware["accelerator"]["memory_gib"] == total / 2**30 and 0 < free <= total


def test_running_out_of_memory_raises_the_error_the_check_catches_and_the_memory_comes_back():
    from pods_bench.gpu_check import DeviceMemory

    memory = DeviceMemory("cuda")
    before = torch.cuda.memory_allocated()
    _, total = torch.cuda.mem_get_info(0)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    memory.release()
    assert torch.cuda.memory_allocated() == before


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_a_measured_step_reads_resting_memory_and_steady_state_peaks(mode):
    """Resting memory holds the weights and AdamW's state (the warm-up update made it); each phase's
    peak is counted from its own start, and the update's lies above what rests."""
    from dataclasses import replace

    from pods_bench.gpu_check import QWEN_3B, measure_step, paper_config, shapes
    from pods_bench.planning.architecture import known_models

    s = shapes("cpu")  # tiny lengths, on the GPU
    dims = replace(known_models()[QWEN_3B], hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512, vocab=4096)
    row = measure_step(paper_config("cuda", mode, 8, 4, s), dims, "cuda", s)
    assert row["completion_tokens"] == 8 * s["completion"]
    assert row["optimizer_mib"] > 0 and row["resting_mib"] >= row["weights_mib"] + row["optimizer_mib"] - 1
    assert row["peak_gen_mib"] >= row["resting_mib"] and row["peak_update_mib"] > row["resting_mib"]


def test_a_sharded_process_of_one_over_nccl_reads_each_phase():
    """pods_bench.sharding.shard in an NCCL process group of one, at small dimensions: each phase has
    its allocated and reserved peaks, the reserved at least the allocated, generation (the whole
    model gathered) and the update above what rests, and the group is gone afterwards."""
    from dataclasses import replace

    import torch.distributed as dist

    from pods_bench.gpu_check import QWEN_3B, SHARDED_RECIPE, at_shapes, measure_sharded, recipe_arms, shapes
    from pods_bench.planning.architecture import known_models

    s = shapes("cpu")["sharded"]  # tiny lengths, on the GPU
    hardware, arms = recipe_arms(SHARDED_RECIPE)
    cfg = at_shapes(arms["pods_n128_m32"], "cuda", s)
    dims = replace(known_models()[QWEN_3B], hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512, vocab=4096)
    row = measure_sharded(cfg, dims, "cuda", s, hardware["processes"])
    assert row["backend"] == "nccl" and row["completion_tokens"] == row["generated"] * s["completion"]
    assert not dist.is_initialized()
    for phase in ("gen", "update", "step"):
        assert row[f"peak_{phase}_reserved_mib"] >= row[f"peak_{phase}_mib"] >= row["resting_mib"] > 0
    assert row["peak_gen_mib"] > row["resting_mib"] and row["peak_update_mib"] > row["resting_mib"]
    assert row["optimizer_mib"] > 0 and row["resting_mib"] >= row["weights_mib"] + row["optimizer_mib"] - 1
