"""Policy models and timed training checkpoints.

A checkpoint is a folder `checkpoints/step-XXXXXX/` holding everything needed to evaluate the policy
or to resume training exactly:

  model/         full weights (Hugging Face folder) or, with LoRA, the adapter (peft folder); + tokenizer
  trainer.pt     optimizer and lr-scheduler state
  rank-<r>.pt    per process: RNG states (python, numpy, torch, cuda, the selection generator), a
                 SHA-256 of the trainable parameters (every process must hold the same weights) and
                 the allocation strategy's state (pods_bench/allocation/)
  state.json     step, train_time_s (training clock), data_cursor, world_size, params_sha256

It is written into `checkpoints/.tmp-step-XXXXXX/` and renamed into place when complete, so any
`step-*` folder is complete and a crash mid-write leaves only a temporary folder (removed on resume).

Reading it back: a single process or DDP loads model/ and trainer.pt on every process (each holds
whole weights and, unless ZeroRedundancyOptimizer shards it, the whole optimizer state anyway).
Under FSDP only rank 0 reads them: it loads model/ and memory-maps trainer.pt, and the weights and
the optimizer state are broadcast into the other processes' shards one tensor at a time
(`load_sharded_policy`, `load_training_state`; pods_bench/sharding.py); the scheduler's small state
is sent to them whole. The files' layout is the same either way.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from pods_bench.errors import PodsBenchError
from pods_bench.failpoints import failpoint
from pods_bench.io import atomic_write_json
from pods_bench.models import build_char_tokenizer, build_tiny_model, load_model_and_tokenizer
from pods_bench.run_dir import CHECKPOINTS
from pods_bench.sharding import (
    broadcast_object,
    full_model_state,
    full_optimizer_state,
    is_sharded,
    load_optimizer_state,
    shard_from_rank0,
)

_NAME = re.compile(r"^step-(\d{6,})$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


# --- the policy model --------------------------------------------------------------------------


def load_base_model(cfg, meta: bool = False):
    """The initial policy from `cfg.model` (no adapter): (model, tokenizer). `meta`: the model built
    on the meta device (no weights read or allocated)."""
    if cfg.model.name == "tiny":
        tokenizer = build_char_tokenizer()
        with torch.device("meta") if meta else nullcontext():
            model = build_tiny_model(cfg.model.tiny, tokenizer, seed=cfg.model.init_seed)
        model.to(getattr(torch, cfg.model.dtype))
    else:
        model, tokenizer = load_model_and_tokenizer(cfg.model.name, dtype=cfg.model.dtype, meta=meta)
    set_attention(model, cfg)
    return model, tokenizer


def set_attention(model, cfg) -> None:
    """`model.attn_implementation`, or a one-line error where its package is missing."""
    try:
        model.set_attn_implementation(cfg.model.attn_implementation)
    except ImportError as e:
        raise PodsBenchError(f"config key model.attn_implementation: {str(e).splitlines()[0]}") from None


def load_policy(cfg, checkpoint: str | Path | None = None, meta: bool = False):
    """The policy to train or evaluate: the base model, with a LoRA adapter if `cfg.lora.enabled`,
    and with the weights of `checkpoint` if given. Returns (model, tokenizer). `meta`: the same
    model on the meta device, weights neither read nor allocated (full fine-tuning only)."""
    if meta and cfg.lora.enabled:
        raise ValueError("a LoRA policy is never built on the meta device (it is never sharded)")
    weights = Path(checkpoint) / "model" if checkpoint is not None else None
    if weights is not None and not cfg.lora.enabled:
        # full fine-tuning: the checkpoint is a complete model folder (weights, config, tokenizer)

        model, tokenizer = load_model_and_tokenizer(str(weights), dtype=cfg.model.dtype, meta=meta)
        set_attention(model, cfg)
        if cfg.model.name == "tiny":
            tokenizer = build_char_tokenizer()  # the exact tokenizer class, not AutoTokenizer's guess
    else:
        model, tokenizer = load_base_model(cfg, meta=meta)
    if cfg.lora.enabled:
        from peft import LoraConfig, PeftModel, get_peft_model

        if weights is not None:
            model = PeftModel.from_pretrained(model, weights, is_trainable=True)
        else:
            lora = cfg.lora
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.r,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=list(lora.target_modules),
                    task_type="CAUSAL_LM",
                ),
            )
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if cfg.lora.enabled:
            model.enable_input_require_grads()  # frozen embeddings would cut the checkpointed graph
    return model, tokenizer


def load_sharded_policy(cfg, accelerator, checkpoint: str | Path | None = None):
    """The policy of a run FSDP shards (pods_bench/sharding.py), without a whole copy on every
    process: each builds it on the meta device and shards it; rank 0 alone loads the weights (the
    base model, or the checkpoint's model folder, on CPU) and they fill every process's shards one
    tensor at a time (sharding.shard_from_rank0). A collective call. Returns (model, tokenizer)."""
    model, tokenizer = load_policy(cfg, checkpoint, meta=True)
    whole = load_policy(cfg, checkpoint)[0] if accelerator.is_main_process else None
    shard_from_rank0(model, whole, cfg, accelerator.device)
    return model, tokenizer


def reference_model(cfg, policy):
    """The frozen reference policy of the KL term: the initial weights. With LoRA that is the base
    model with adapters disabled (no copy needed), so None is returned. It is never sharded: under
    FSDP it would be a whole copy on every process, which is why config.check_fsdp refuses loss.beta
    > 0 and loss.reference_forward there (the 8-GPU recipes have neither); sharding it would need its
    own FSDP units and gathers in reference_logprobs."""
    if cfg.lora.enabled:
        return None
    ref, _ = load_base_model(cfg)
    return ref.to(next(policy.parameters()).device).eval().requires_grad_(False)


def params_sha256(model) -> str:
    """Hash of the trainable parameters (names and exact bytes)."""
    return state_sha256({name: p for name, p in model.named_parameters() if p.requires_grad})


def state_sha256(tensors: dict) -> str:
    """Hash of named tensors (names and exact bytes), in name order."""
    h = hashlib.sha256()
    for name, p in sorted(tensors.items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# --- listing -----------------------------------------------------------------------------------


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders of a run, by step."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and _NAME.match(p.name) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_state(checkpoint: str | Path) -> dict:
    return json.loads((Path(checkpoint) / "state.json").read_text())


def remove_incomplete(run_dir: str | Path) -> None:
    """Temporary folders left by a crash in the middle of writing a checkpoint."""
    folder = Path(run_dir) / CHECKPOINTS
    if folder.is_dir():
        for p in folder.glob(".tmp-*"):
            shutil.rmtree(p, ignore_errors=True)


def prune(run_dir: str | Path, evaluated: set[str]) -> list[str]:
    """keep_checkpoints=last: delete evaluated checkpoints except the newest (resume needs it)."""
    found = list_checkpoints(run_dir)
    removed = []
    for p in found[:-1]:
        if p.name in evaluated:
            shutil.rmtree(p)
            removed.append(p.name)
    return removed


# --- writing and reading training state ---------------------------------------------------------


def rng_state(selection_generator: torch.Generator) -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "selection": selection_generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, selection_generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    selection_generator.set_state(state["selection"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: str | Path, progress: dict, learner, tokenizer, selection_generator: torch.Generator, allocator=None
) -> Path:
    """Write a checkpoint atomically; a collective call (every process writes its rank file).
    `progress`: step, train_time_s (the training clock) and data_cursor; `learner`: the trainer's
    policy, optimizer, scheduler and accelerator (pods_bench.train.Learner); `allocator`: the
    allocation strategy, whose state (buffers, per-prompt histories) goes into the rank file."""
    model, optimizer, scheduler, accelerator = (
        learner.policy,
        learner.optimizer,
        learner.scheduler,
        learner.accelerator,
    )
    final = Path(run_dir) / CHECKPOINTS / checkpoint_name(progress["step"])
    tmp = final.with_name(f".tmp-{final.name}")
    rank = accelerator.process_index
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        failpoint("checkpoint")
    accelerator.wait_for_everyone()
    if is_sharded(model):  # the whole model and optimizer state, gathered on rank 0 (collective calls)
        weights, optimizer_state = full_model_state(model), full_optimizer_state(model, optimizer)
        sha = state_sha256(weights) if accelerator.is_main_process else None
    else:
        weights, sha = None, params_sha256(model)
        if hasattr(optimizer, "consolidate_state_dict"):  # sharded (ZeroRedundancyOptimizer): gather on rank 0
            optimizer.consolidate_state_dict(to=0)
        optimizer_state = optimizer.state_dict() if accelerator.is_main_process else None
    allocation = allocator.state_dict() if allocator is not None else {}
    torch.save(
        {"rng": rng_state(selection_generator), "params_sha256": sha, "allocation": allocation},
        tmp / f"rank-{rank}.pt",
    )
    if accelerator.is_main_process:
        model.save_pretrained(tmp / "model", state_dict=weights)
        tokenizer.save_pretrained(tmp / "model")
        torch.save({"optimizer": optimizer_state, "scheduler": scheduler.state_dict()}, tmp / "trainer.pt")
    accelerator.wait_for_everyone()  # every rank file is written
    if accelerator.is_main_process:
        state = {
            "checkpoint": final.name,
            "step": progress["step"],
            "train_time_s": progress["train_time_s"],
            "data_cursor": progress["data_cursor"],
            "world_size": accelerator.num_processes,
            "params_sha256": sha,
        }
        atomic_write_json(tmp / "state.json", state)
        tmp.rename(final)  # the commit point: a step-* folder is always complete
    accelerator.wait_for_everyone()
    return final


def load_training_state(checkpoint: Path, learner, selection_generator, allocator=None) -> dict:
    """Restore optimizer, scheduler, this process's RNG states and the allocation strategy's state;
    returns state.json."""
    optimizer, scheduler, accelerator = learner.optimizer, learner.scheduler, learner.accelerator
    state = read_state(checkpoint)
    if state["world_size"] != accelerator.num_processes:
        raise PodsBenchError(
            f"checkpoint {checkpoint} was written by {state['world_size']} processes; "
            f"resume it with the same number (now {accelerator.num_processes})"
        )
    if is_sharded(learner.model):
        # rank 0 alone reads trainer.pt, memory-mapped (the optimizer's tensors are paged in as they
        # are scattered into the shards); the other processes get the scheduler's state from it
        trainer = None
        if accelerator.is_main_process:
            trainer = torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=False, mmap=True)
        load_optimizer_state(learner.model, optimizer, trainer["optimizer"] if trainer is not None else None)
        scheduler.load_state_dict(broadcast_object(trainer["scheduler"] if trainer is not None else None))
        del trainer
    else:
        trainer = torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=False)
        optimizer.load_state_dict(trainer["optimizer"])
        scheduler.load_state_dict(trainer["scheduler"])
    rank_state = torch.load(checkpoint / f"rank-{accelerator.process_index}.pt", weights_only=False)
    set_rng_state(rank_state["rng"], selection_generator)
    if allocator is not None and rank_state.get("allocation"):
        allocator.load_state_dict(rank_state["allocation"])
    return state
