"""Rollout engines by name: the trainer calls `make_engine(cfg, model, tokenizer)` and never learns
which one it talks to.

  hf    transformers `generate` on the trainer's own model object (pods_bench.engines.hf)
  vllm  a colocated in-process vLLM engine, weights pushed after every update (pods_bench.engines.vllm)

Each entry is a factory `(cfg: TrainConfig, model, tokenizer) -> RolloutEngine` that imports its
module lazily, so vLLM is only imported when it is asked for.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable

from pods_bench.engines.base import RolloutEngine, Rollouts, SamplingConfig

__all__ = ["ENGINES", "make_engine", "RolloutEngine", "Rollouts", "SamplingConfig"]


def _hf(cfg, model, tokenizer) -> RolloutEngine:
    import torch

    from pods_bench.engines.hf import HFEngine

    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.model.mixed_precision)
    return HFEngine(model, tokenizer, max_batch=cfg.engine.max_batch, autocast_dtype=autocast)


def _vllm(cfg, model, tokenizer) -> RolloutEngine:
    from pods_bench.engines.vllm import VLLMEngine

    model_path = cfg.model.name
    if model_path == "tiny":
        # vLLM reads the architecture and tokenizer from a folder: write the tiny model to one.
        from safetensors.torch import save_file

        from pods_bench.engines.vllm import export_weights

        model_path = tempfile.mkdtemp(prefix="pods-bench-tiny-model-")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        # written by hand, not with save_pretrained, which writes only on rank 0 of a distributed run
        # while every process starts its own engine; FSDP's class name is not the architecture's
        weights = {name: t.detach().contiguous().clone() for name, t in export_weights(model)}  # LoRA merged in
        save_file(weights, f"{model_path}/model.safetensors", metadata={"format": "pt"})
        base.config.architectures = [type(base).__name__.removeprefix("FSDP")]
        base.config.save_pretrained(model_path)
        tokenizer.save_pretrained(model_path)
    engine = VLLMEngine(model_path, tokenizer, options=cfg.engine.options, seed=cfg.seed)
    engine.sync_weights(model)  # the folder holds the initial weights, the policy may not (LoRA, resume)
    return engine


ENGINES: dict[str, Callable] = {"hf": _hf, "vllm": _vllm}


def make_engine(cfg, model, tokenizer) -> RolloutEngine:
    """The rollout engine named by `cfg.engine.name`, sampling from `model`."""
    from pods_bench.errors import PodsBenchError

    if cfg.engine.name not in ENGINES:
        raise PodsBenchError(f"unknown engine {cfg.engine.name!r}; choose from {', '.join(ENGINES)}")
    return ENGINES[cfg.engine.name](cfg, model, tokenizer)
