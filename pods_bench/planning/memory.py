"""Memory per device of one training run, counted from the config (nothing is loaded).

    persistent   weights (+ LoRA adapters, fp32) + AdamW moments (2 x fp32 per trainable parameter,
                 1/K each with optim.shard_optimizer_state over K processes) + a frozen reference
                 model (KL term, full fine-tuning)
    update       gradients (fp32, one per trainable parameter; with several processes DDP keeps them
                 in its all-reduce buckets, gradient_as_bucket_view, so there is no second copy)
                 + activations of one forward/backward pass + its log-prob chunk
                 + the autocast cache (below)
    step         the optimizer step: gradients + AdamW's temporaries (on CUDA torch's multi-tensor
                 AdamW makes one fp32 temporary per trainable parameter of this process; on CPU it
                 goes tensor by tensor, so they are negligible: measured 0.24 bytes per parameter)
    generation   HF generate (one call of up to engine.max_batch rows): its KV cache and the larger of
                 the prefill's activations and a decode step's temporaries (below), with the autocast
                 cache; vLLM: the gpu_memory_utilization share it reserves for the whole run
    peak         what the allocator holds at the largest phase (persistent + the largest of update,
                 step and HF generation, which take turns; with vLLM persistent + the larger of update
                 and step + vLLM's share), plus the reserve (below), the framework's share (CUDA
                 context, outside the allocator) and, with several CUDA processes, NCCL's buffers

The reserve: the caching allocator holds more than live tensors (reserved >= allocated): freed blocks
wait for reuse, and phases of very different shapes fragment them. Training and evaluation jobs run
with expandable segments (pods_bench/cuda_memory.py), which keep reserved memory within a few per
cent of allocated; the plan adds RESERVED_SHARE = 10 % of the allocated peak, the upper end of what
fragmentation typically costs, and train_log's peak_reserved_* fields measure it on a real run.
NCCL's communication buffers (per channel and peer, outside PyTorch's allocator) are counted as
NCCL_GIB per process on a multi-GPU node.

HF generate, per call of R rows (P prompt, C completion tokens): the KV cache grows to
R (P + C) x 2 layers x kv width x c bytes, and at each decode step torch.cat makes a layer's longer
copy before freeing the old one (one layer's cache more, briefly). The prefill runs all R P prompt
tokens through a block at once: the MLP holds silu(gate), up and their product (3 f) beside the normed
input, the residual stream and the attention output (3 h), c bytes each, so R P c (3 f + 3 h) on top
of the prompt's KV. That is an evaluation call's prefill (R distinct prompts); a training call's n
rows of a prompt share one prefill, copied to the rows (pods_bench/engines/hf.py), so the R-row count
bounds both. A decode step (logits of the last position only) holds R x vocabulary entries:
the compute-dtype logits and DECODE_FLOAT32_COPIES float32 tensors (their float32 copy, the
temperature-scaled scores, the engine's log-softmax of the previous step and of this one
(pods_bench/engines/hf.py), the top-k-masked scores and the softmax probabilities). The larger of
prefill and the end of decoding is the call's peak. Measured on CPU (tests/test_planning.py) for a
prefill-, a vocabulary- and a KV-cache-dominated call: within 10 % of the peak above the resting
process.

With optim.fsdp (pods_bench/sharding.py) over K processes the float32 weights, gradients and AdamW
state are 1/K each (gradients are reduce-scattered after every pass: the ZeRO-2 layout); there is no
autocast (FSDP casts), and instead the gathered parameters in the compute dtype: the whole model
while generating (and evaluating, and syncing the engine), and in the update: the root unit
(embeddings, final norm, head), gathered for the whole pass with its compute-dtype gradient and, at
its reduce-scatter, a float32 copy of that gradient; the decoder layer being computed, likewise; the
previous layer's float32 reduce-scatter input still in flight; and the next layer, prefetched.

The autocast cache: under bf16 autocast with float32 weights, every linear layer's weight is cast to
bf16 once per autocast region and the copy kept until the region ends (the whole forward pass, the
whole of HF generate): 2 bytes per parameter.

Activations are counted tensor by tensor for a Llama/Qwen block under PyTorch's SDPA attention (no
(S x S) score matrix is kept). Per token and layer a block saves its two norm inputs (the residual
stream, in the weights' dtype) and, in the compute dtype c, the norm outputs, q, k, v, the rotated
q and k, the attention output, gate, up, silu(gate) and their product:
    bytes = 2 r h + c (2 h + 3 q + 3 kv + 4 f)      (r: residual bytes; q, kv: the q and k/v widths,
                                                     q = h but in Qwen3)
With gradient checkpointing only each block's input (r h per token) is kept, plus one block's full
set while it is recomputed. Outside the blocks: the final norm keeps its input and output (2 r h per
token), and the backward pass holds the residual stream's gradient going in and out of a block
(2 r h more). A pass has at most optim.rows_per_pass rows (default: the micro-batch).

The log-probs (pods_bench/logprobs.py) are taken optim.logprob_chunk_tokens completion tokens at a
time under checkpointing, so only one chunk's logits exist at once: 16 bytes per token x vocabulary
entry in float32 (measured on CPU, tests/test_planning.py: the float32 logits, and in the backward
pass the softmax gradient, the gather's gradient and their sum), 2 more under autocast (the head's
bf16 output).

Two verdicts: `fits` (the peak at the config's limits, every row as long as allowed) and
`fits_floor` (without activations: weights, optimizer state, and the gradients and the engine's
share, together with vLLM, in turn with HF generate). A
config whose floor does not fit cannot run at all; one whose peak does not fit may run out of
memory on its longest batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pods_bench.config import uses_fsdp
from pods_bench.engines.vllm import VLLMEngineConfig
from pods_bench.planning.architecture import ModelDims

GIB = 1024**3
RESERVED_SHARE = 0.10  # reserved over allocated memory, with expandable segments (module docstring)
NCCL_GIB = 1.0  # NCCL's buffers per process on a multi-GPU node (module docstring)
DECODE_FLOAT32_COPIES = 6  # float32 vocabulary-wide tensors of one decode step (module docstring)
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


def logits_bytes(cfg, dims: ModelDims, completion_tokens: int) -> int:
    """The log-prob chunk's logits: at most optim.logprob_chunk_tokens positions at once."""
    per_element = 16 + (2 if compute_bytes(cfg) == 2 else 0)
    return min(completion_tokens, cfg.optim.logprob_chunk_tokens) * dims.vocab * per_element


def activation_bytes(cfg, dims: ModelDims, rows: int, lengths: Lengths, sharded: bool = False) -> int:
    """Activations and log-prob logits of one forward/backward pass of `rows` sequences. The residual
    stream is in the weights' dtype, or in the compute dtype when FSDP casts the parameters."""
    c = compute_bytes(cfg)
    r = c if sharded else DTYPE_BYTES[cfg.model.dtype]
    tokens = rows * (lengths.prompt + lengths.completion)
    block = block_activation_bytes(dims, c, r)
    if cfg.model.gradient_checkpointing:
        blocks = dims.layers * r * dims.hidden * tokens + block * tokens
    else:
        blocks = dims.layers * block * tokens
    outside = 4 * r * dims.hidden * tokens  # the final norm's input and output, the gradient in flight
    return blocks + outside + logits_bytes(cfg, dims, rows * lengths.completion)


def kv_bytes_per_token(dims: ModelDims, compute: int) -> int:
    return 2 * dims.layers * dims.kv_width * compute


def sequences_per_process(cfg, processes: int) -> int:
    return cfg.prompts_per_step // processes * cfg.selection.groups_per_prompt * cfg.selection.n


def trained_per_process(cfg, processes: int) -> int:
    return cfg.prompts_per_step // processes * cfg.selection.groups_per_prompt * cfg.selection.m


def rows_per_pass(cfg, processes: int) -> int:
    """Rows of the largest forward/backward pass of the update (pods_bench/update.py loss_passes)."""
    micro = min(cfg.optim.micro_batch_size, trained_per_process(cfg, processes))
    return min(cfg.optim.rows_per_pass or micro, micro)


def autocast_cache_bytes(cfg, dims: ModelDims) -> int:
    """bf16 copies of the float32 weights that autocast keeps while a forward pass or generate runs."""
    return dims.params * 2 if compute_bytes(cfg) == 2 and DTYPE_BYTES[cfg.model.dtype] == 4 else 0


def gathered_unit_bytes(cfg, dims: ModelDims) -> int:
    """FSDP's update (module docstring): the root unit and the layer being computed, each with its
    compute-dtype gradient and float32 reduce-scatter input; the previous layer's reduce-scatter
    input; the next layer's parameters."""
    c = compute_bytes(cfg)
    root = dims.params - dims.layers * dims.layer_params
    return (root + dims.layer_params) * (2 * c + 4) + dims.layer_params * (4 + c)


def hf_generation_bytes(cfg, dims: ModelDims, rows: int, lengths: Lengths) -> int:
    """One HF generate call of `rows` rows: KV cache and the larger of prefill and decoding (module docstring)."""
    c = compute_bytes(cfg)
    kv_token = kv_bytes_per_token(dims, c)
    prefill = rows * lengths.prompt * (kv_token + c * (3 * dims.intermediate + 3 * dims.hidden))
    kv = kv_token * rows * (lengths.prompt + lengths.completion)
    decode = kv + kv // dims.layers + rows * dims.vocab * (4 * DECODE_FLOAT32_COPIES + c)
    return max(prefill, decode)


def memory_estimate(cfg, dims: ModelDims, hardware: dict, lengths: Lengths | None = None) -> dict:
    """Bytes per device by component, with the peak and the verdict against the memory of `hardware`
    (a setup of config/hardware.yaml: its processes, device and accelerator).

    `lengths` defaults to the config's limits (task.max_prompt_tokens, sampling.max_new_tokens)."""
    accelerator, processes = hardware["accelerator"], hardware["processes"]
    lengths = lengths or Lengths(cfg.task.max_prompt_tokens, cfg.sampling.max_new_tokens)
    w = DTYPE_BYTES[cfg.model.dtype]
    trainable = trainable_params(cfg, dims)
    fsdp = uses_fsdp(cfg, processes)
    shards = processes if (cfg.optim.shard_optimizer_state or fsdp) and processes > 1 else 1
    held = processes if fsdp else 1  # weights and gradients: whole on every process, or 1/K with FSDP
    parts = {
        "weights": math.ceil(dims.params * w / held) + (trainable * 4 if cfg.lora.enabled else 0),
        "optimizer": math.ceil(2 * trainable * 4 / shards),
        "reference_model": dims.params * w if cfg.loss.beta > 0 and not cfg.lora.enabled else 0,
        "framework": int(accelerator["framework_overhead_gb"] * GIB),
        "gradients": math.ceil(trainable * 4 / held),
        "activations": activation_bytes(cfg, dims, rows_per_pass(cfg, processes), lengths, sharded=fsdp),
        "autocast_cache": 0 if fsdp else autocast_cache_bytes(cfg, dims),
        "gathered_weights": dims.params * compute_bytes(cfg) if fsdp else 0,  # the whole model, generating
        "gathered_units": gathered_unit_bytes(cfg, dims) if fsdp else 0,  # in the update
        # torch's multi-tensor (foreach) AdamW, the CUDA default: one fp32 temporary per parameter
        "optimizer_step": math.ceil(trainable * 4 / shards) if hardware["device"] == "cuda" else 0,
    }
    rows = sequences_per_process(cfg, processes)
    vllm = cfg.engine.name == "vllm"
    if vllm:
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
        parts["engine"] = hf_generation_bytes(cfg, dims, rows_per_call, lengths)
        concurrent = rows_per_call
    persistent = parts["weights"] + parts["optimizer"] + parts["reference_model"]  # in the allocator
    update = parts["gradients"] + parts["activations"] + parts["autocast_cache"] + parts["gathered_units"]
    step = parts["gradients"] + parts["optimizer_step"]
    # vLLM holds its own weights; HF generate reads the trainer's (cast or gathered)
    generation = parts["engine"] + (0 if vllm else parts["autocast_cache"] + parts["gathered_weights"])
    # what the allocator holds in each phase: vLLM's share is reserved for the whole run; HF generate's
    # cache and the update take turns (gradients are freed after each optimizer step)
    phases = {"update": update, "step": step, "generation": generation}
    if vllm:
        phases = {"update": update + generation, "step": step + generation}
    phases = {phase: persistent + bytes_ for phase, bytes_ in phases.items()}
    cuda = hardware["device"] == "cuda"
    parts["reserve"] = math.ceil(RESERVED_SHARE * max(phases.values())) if cuda else 0
    parts["nccl"] = int(NCCL_GIB * GIB) if cuda and processes > 1 else 0
    outside = parts["reserve"] + parts["framework"] + parts["nccl"]  # beyond the allocated tensors
    peak = max(phases.values()) + outside
    capacity = int(accelerator["memory_gib"] * GIB)
    floor_allocated = persistent + (step + generation if vllm else max(step, generation))
    floor = floor_allocated + (math.ceil(RESERVED_SHARE * floor_allocated) if cuda else 0) + parts["framework"]
    floor += parts["nccl"]
    return {
        "parts": parts,
        "phases": phases,  # allocated bytes at each phase's peak
        "allocated_peak": max(phases.values()),
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
