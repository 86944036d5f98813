"""The CUDA code path, on a GPU only (marker `cuda`; skipped elsewhere, run by `make gpu-check`):
sampling log-probs equal the trainer's under bf16 autocast, a short run trains on the GPU, and
full fine-tuning keeps float32 master weights there."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_sampling_logprobs_equal_the_trainers_on_cuda():
    from pods_bench.config import config_from_dict
    from pods_bench.engines.base import SamplingConfig
    from pods_bench.engines.hf import HFEngine
    from pods_bench.models import build_char_tokenizer, build_tiny_model
    from pods_bench.train import KeptRollout, completion_logprobs, pack

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
