"""Full fine-tuning sharded over the processes with PyTorch FSDP2 (`optim.fsdp`).

The layout of the authors' 8-GPU runs (DeepSpeed ZeRO-2 with bf16, open-r1 exp.sh at 9459b96):
float32 master weights, AdamW state and gradients held 1/K per process, bf16 parameters for the
forward pass and for generation. FSDP2 (`torch.distributed.fsdp.fully_shard`, torch >= 2.7) gives it
with `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`: each decoder layer and the
rest of the model are sharded units; a unit's bf16 parameters are all-gathered for its forward and
backward pass and freed after, and AdamW steps each process's float32 shard.

Gradients are reduce-scattered in float32 at the end of every forward/backward pass, as DeepSpeed's
ZeRO-2 reduces every micro-step, and accumulate in the float32 shard: between the passes of an update
a process holds 4 P / K bytes of gradient (tests/test_fsdp_gradients.py measures it). FSDP2's
`set_requires_gradient_sync(False)` (gradient accumulation without communication) would instead keep
every parameter's whole float32 gradient on every process until the last pass, 4 P bytes: the
ZeRO-1 layout, 11.5 GiB at 3B where this one holds 1.4. What differs from ZeRO-2 beyond memory: the
parameters are sharded between passes too (ZeRO-3) and re-gathered for every pass (an all-gather per
unit and pass, where ZeRO-2 keeps bf16 weights whole), and the output layer's bf16 gradient is summed
over the log-prob chunks in bf16 before the float32 reduce (pods_bench/logprobs.py) where DeepSpeed
accumulates into float32 at once.

Chosen over DeepSpeed through accelerate because it is part of torch (no extra dependency or
compiled op), runs with gloo on CPU, and its units are ordinary modules, so HF `generate`, the
log-prob head (pods_bench/logprobs.py) and checkpoints work on them unchanged.

Generation and evaluation run on whole weights: `gathered` all-gathers every unit once and keeps
it whole until the block ends (a decode step must not all-gather: the processes' generate calls run
different numbers of steps). Checkpoints hold the full float32 model (an ordinary Hugging Face
folder) and the full optimizer state, gathered on rank 0, and are loaded back into the shards.

Start-up and resume read that state on rank 0 alone, so no other process ever holds a whole copy
(a 7B model is 30.5 GB in float32 and its AdamW state 61 GB: eight copies would not fit a node's
host memory). Every process builds the model on the meta device (no storage) and shards it; rank 0
loads the weights (the base model or the checkpoint's model folder) on CPU, and `shard_from_rank0`
broadcasts them one tensor at a time, each process keeping its slices; buffers outside the state
dict (rotary inv_freq) are broadcast from rank 0 too, and a tied output layer stays one parameter
with the embeddings. On resume rank 0 memory-maps trainer.pt and `load_optimizer_state` scatters
the optimizer state the same way; the other processes never open the file and get the scheduler's
state from rank 0 (checkpoint.load_training_state).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from pods_bench.cuda_memory import release_cached_memory


def is_sharded(model) -> bool:
    return isinstance(model, FSDPModule)


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks of a Llama/Qwen causal LM (model.model.layers)."""
    return list(model.get_decoder().layers)


def shard(model, cfg, device, reduce_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Shard `model` (float32 weights, whole on every process) in place: one FSDP unit per decoder
    layer and one for the rest (embeddings, final norm and the output layer, which may share the
    embeddings' weight). `reduce_dtype` is the gradients' in the reduce-scatter (float32, as ZeRO-2
    with bf16 reduces; another only for tests that must see the difference)."""
    model.to(device)
    _fully_shard(model, cfg, reduce_dtype)
    return model


def _fully_shard(model, cfg, reduce_dtype: torch.dtype = torch.float32) -> None:
    compute = torch.bfloat16 if cfg.model.mixed_precision == "bf16" else None
    policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=reduce_dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def shard_from_rank0(model, whole, cfg, device) -> torch.nn.Module:
    """Shard `model`, built on the meta device on every process, and fill the shards from `whole`,
    the same model with its weights on rank 0 (None elsewhere): no process but rank 0 ever holds
    more than its shards and one whole tensor at a time. A collective call.

    `to_empty` allocates each process's shards in place, so a weight tied to another (the output
    layer sharing the embeddings) stays one parameter; rank 0's state dict is then broadcast tensor
    by tensor and each process keeps its slices. Buffers are not sharded, and those outside the
    state dict (the rotary embedding's inv_freq) would stay uninitialised: rank 0's are broadcast."""
    _fully_shard(model, cfg)
    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, whole.state_dict() if whole is not None else {}, options=options)
    spec = broadcast_object({n: (b.dtype, b.shape) for n, b in whole.named_buffers()} if whole is not None else None)
    for name, (dtype, shape) in spec.items():
        if whole is not None:
            value = whole.get_buffer(name).to(device, copy=True)
        else:
            value = torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(value, src=0)
        module, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module), attr, value)  # stays (non-)persistent as it was
    return model


def units(model) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(model, engine):
    """Every unit whole (bf16 under mixed precision) for the block, where `engine` samples from the
    trainer's own module (HF generate). A collective call: every process enters it. A no-op when the
    model is not sharded or the engine holds its own weights (vLLM: its sync gathers them)."""
    if not is_sharded(model) or not engine.samples_from_trainer:
        yield
        return
    fsdp_units = units(model)
    for unit in fsdp_units:
        unit.set_reshard_after_forward(False)  # a forward pass inside must not free (or gather) again
        unit.unshard()
    try:
        yield
    finally:
        for unit in fsdp_units:
            unit.reshard()
            unit.set_reshard_after_forward(True)
        release_cached_memory(next(model.parameters()).device)  # generation's blocks: not the update's shapes


def gradient_bytes(model) -> int:
    """Bytes of gradient this process holds now: its float32 shards plus whatever whole gradients FSDP
    keeps between passes (none while every pass reduce-scatters). Reads FSDP2's per-parameter state,
    which has no public accessor: for tests and the GPU check, not for the training loop."""
    held = 0
    for unit in units(model):
        state = unit._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]  # torch < 2.12: one
        for fsdp_param in (p for group in groups if group is not None for p in group.fsdp_params):
            whole = [fsdp_param.unsharded_accumulated_grad]
            if hasattr(fsdp_param, "_unsharded_param"):
                whole.append(fsdp_param._unsharded_param.grad)
            shard_grad = fsdp_param.sharded_param.grad
            whole.append(shard_grad.to_local() if isinstance(shard_grad, DTensor) else shard_grad)
            held += sum(t.numel() * t.element_size() for t in whole if t is not None)
    return held


def total_norm(norm) -> float:
    """clip_grad_norm_'s result as a number (a DTensor when the gradients are sharded)."""
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


# --- checkpoints: full state on rank 0 -----------------------------------------------------------


def full_model_state(model) -> dict:
    """The whole float32 state dict, on CPU, on rank 0 (empty elsewhere), without the second name of a
    tied weight (the output layer sharing the embeddings), as save_pretrained writes it. A collective call."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    return {name: tensor for name, tensor in state.items() if name not in tied}


def full_optimizer_state(model, optimizer) -> dict:
    """AdamW's whole state keyed by parameter name, on CPU, on rank 0. A collective call.

    Before the first step there is no state, and torch's state-dict helpers would create it with a
    zero-gradient step, which advances AdamW's step count and so changes its bias correction for
    the rest of the run; the empty state is saved as it is instead."""
    if not optimizer.state:
        return optimizer.state_dict()
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model, optimizer, saved: dict | None) -> None:
    """Scatter rank 0's full optimizer state (`saved`; None on the other processes, which never read
    it) into every process's shard, one tensor at a time. A collective call."""
    if broadcast_object(saved is not None and not saved["state"]):
        return  # saved before the first step: a fresh optimizer is that state
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=saved if saved is not None else {}, options=options)


def broadcast_object(value):
    """Rank 0's `value` (a small picklable object) on every process. A collective call."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
