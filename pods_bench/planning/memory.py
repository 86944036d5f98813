"""Memory per device of one training run, counted from the config (nothing is loaded).

    persistent   weights (+ LoRA adapters, fp32) + AdamW moments (2 x fp32 per trainable parameter,
                 1/K each with optim.shard_optimizer_state over K processes) + a frozen reference
                 model (KL term, full fine-tuning) + the framework's own share
    update       gradients (fp32, one per trainable parameter) + activations of one micro-batch
                 + its completion logits
    generation   HF generate: the KV cache of one generate call (engine.max_batch rows) and its
                 decoding logits; vLLM: the gpu_memory_utilization share it reserves for the whole run
    peak         persistent + the larger of update and HF generation (they take turns), or with vLLM
                 persistent + update + vLLM's share

Activations are counted tensor by tensor for a Llama/Qwen block under PyTorch's SDPA attention (no
(S x S) score matrix is kept). Per token and layer a block saves its two norm inputs (the residual
stream, in the weights' dtype) and, in the compute dtype c, the norm outputs, q, k, v, the rotated
q and k, the attention output, gate, up, silu(gate) and their product:
    bytes = 2 r h + c (2 h + 3 q + 3 kv + 4 f)      (r: residual bytes; q, kv: the q and k/v widths,
                                                     q = h but in Qwen3)
With gradient checkpointing only each block's input (r h per token) is kept, plus one block's full
set while it is recomputed. Outside the blocks: the final norm keeps its input and output (2 r h per
token), and the backward pass holds the residual stream's gradient going in and out of a block
(2 r h more). The LM head's logits for the completion positions cost 16 bytes an element in
float32 (measured on CPU, tests/test_planning.py: the float32 copy log-softmax keeps, and in the
backward pass the softmax gradient, the gather's gradient and their sum), 2 more under autocast
(the head's bf16 output). With a 150k vocabulary they are the largest activation by far.

Two verdicts: `fits` (the peak at the config's limits, every row as long as allowed) and
`fits_floor` (without activations: weights, optimizer state, and the gradients and the engine's
share, together with vLLM, in turn with HF generate). A
config whose floor does not fit cannot run at all; one whose peak does not fit may run out of
memory on its longest batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pods_bench.planning.architecture import ModelDims

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Lengths:
    """Token counts the estimate needs: the widest prompt and completion of a batch (worst case:
    the config's limits)."""

    prompt: int
    completion: int


def compute_bytes(cfg) -> int:
    """Bytes of an activation: bf16/fp16 under autocast or with half-precision weights, else 4."""
    if (cfg.model.mixed_precision or "no") != "no":
        return 2
    return DTYPE_BYTES[cfg.model.dtype]


def trainable_params(cfg, dims: ModelDims) -> int:
    return dims.lora_params(cfg.lora.r, cfg.lora.target_modules) if cfg.lora.enabled else dims.params


def block_activation_bytes(dims: ModelDims, compute: int, residual: int) -> int:
    """Bytes one block keeps per token for its backward pass (module docstring)."""
    h, q, kv, f = dims.hidden, dims.q_width, dims.kv_width, dims.intermediate
    return 2 * residual * h + compute * (2 * h + 3 * q + 3 * kv + 4 * f)


def activation_bytes(cfg, dims: ModelDims, rows: int, lengths: Lengths) -> int:
    """Activations and logits of one micro-batch of `rows` sequences in the update."""
    c, r = compute_bytes(cfg), DTYPE_BYTES[cfg.model.dtype]
    tokens = rows * (lengths.prompt + lengths.completion)
    block = block_activation_bytes(dims, c, r)
    if cfg.model.gradient_checkpointing:
        blocks = dims.layers * r * dims.hidden * tokens + block * tokens
    else:
        blocks = dims.layers * block * tokens
    outside = 4 * r * dims.hidden * tokens  # the final norm's input and output, the gradient in flight
    logits = rows * (lengths.completion + 1) * dims.vocab * (16 + (2 if c == 2 else 0))
    return blocks + outside + logits


def kv_bytes_per_token(dims: ModelDims, compute: int) -> int:
    return 2 * dims.layers * dims.kv_width * compute


def sequences_per_process(cfg, processes: int) -> int:
    return cfg.prompts_per_step // processes * cfg.selection.groups_per_prompt * cfg.selection.n


def trained_per_process(cfg, processes: int) -> int:
    return cfg.prompts_per_step // processes * cfg.selection.groups_per_prompt * cfg.selection.m


def memory_estimate(cfg, dims: ModelDims, hardware: dict, lengths: Lengths | None = None) -> dict:
    """Bytes per device by component, with the peak and the verdict against the memory of `hardware`
    (a setup of config/hardware.yaml: its processes, device and accelerator).

    `lengths` defaults to the config's limits (task.max_prompt_tokens, sampling.max_new_tokens)."""
    accelerator, processes = hardware["accelerator"], hardware["processes"]
    lengths = lengths or Lengths(cfg.task.max_prompt_tokens, cfg.sampling.max_new_tokens)
    c, w = compute_bytes(cfg), DTYPE_BYTES[cfg.model.dtype]
    trainable = trainable_params(cfg, dims)
    shards = processes if cfg.optim.shard_optimizer_state and processes > 1 else 1
    parts = {
        "weights": dims.params * w + (trainable * 4 if cfg.lora.enabled else 0),
        "optimizer": math.ceil(2 * trainable * 4 / shards),
        "reference_model": dims.params * w if cfg.loss.beta > 0 and not cfg.lora.enabled else 0,
        "framework": int(accelerator["framework_overhead_gb"] * GIB),
        "gradients": trainable * 4,
        "activations": activation_bytes(
            cfg, dims, min(cfg.optim.micro_batch_size, trained_per_process(cfg, processes)), lengths
        ),
    }
    rows = sequences_per_process(cfg, processes)
    vllm = cfg.engine.name == "vllm"
    if vllm:
        from pods_bench.engines.vllm import VLLMEngineConfig

        options = VLLMEngineConfig.from_options(cfg.engine.options)
        own_weights = dims.params * 2  # vLLM holds its own bf16 copy of the weights
        if hardware["device"] == "cpu":  # the CPU build takes a fixed KV cache instead of a share
            parts["engine"] = own_weights + int(options.cpu_kv_cache_gib * GIB)
        else:
            parts["engine"] = int(options.gpu_memory_utilization * accelerator["memory_gib"] * GIB)
        per_sequence = kv_bytes_per_token(dims, 2) * (lengths.prompt + lengths.completion)
        concurrent = min(options.max_num_seqs, max(0, parts["engine"] - own_weights) // per_sequence)
    else:
        rows_per_call = min(cfg.engine.max_batch, rows)
        kv = kv_bytes_per_token(dims, c) * rows_per_call * (lengths.prompt + lengths.completion)
        parts["engine"] = kv + rows_per_call * dims.vocab * 4 * 2  # + the step's logits and their softmax
        concurrent = rows_per_call
    persistent = parts["weights"] + parts["optimizer"] + parts["reference_model"] + parts["framework"]
    update = parts["gradients"] + parts["activations"]
    peak = persistent + update + parts["engine"] if vllm else persistent + max(update, parts["engine"])
    capacity = int(accelerator["memory_gib"] * GIB)
    # HF generate's cache and the gradients take turns (gradients are freed after each update)
    floor = persistent + (parts["gradients"] + parts["engine"] if vllm else max(parts["gradients"], parts["engine"]))
    return {
        "parts": parts,
        "trainable_params": trainable,
        "params": dims.params,
        "peak": peak,
        "capacity": capacity,
        "fits": peak <= capacity,
        "floor": floor,
        "fits_floor": floor <= capacity,
        "margin": capacity - peak,
        "concurrent_sequences": int(concurrent),
        "sequences_per_step": rows,
    }
