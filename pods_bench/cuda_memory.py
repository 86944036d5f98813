"""The CUDA allocator around a training or evaluation job: its configuration, the peaks of each phase
of a step (train_log.jsonl), and handing cached blocks back between phases. No-ops on CPU.

Why reserved memory matters: the allocator keeps freed blocks cached for reuse, and a run whose phases
allocate tensors of very different shapes (HF generate's KV cache grows by concatenation at every
decode step, then the update's activations) can hold far more reserved than allocated memory, and
run out of memory with enough free in total. `expandable_segments:True` lets segments grow in place
instead of leaving holes between fixed-size ones; releasing the cache after generation starts the
update from what it allocates itself. The plan (pods_bench/planning/memory.py) counts allocated bytes
and adds a margin for the rest.
"""

from __future__ import annotations

import os

import torch

GIB = 1024**3
# what the training and evaluation jobs set unless the user did (read once, when CUDA first allocates)
ALLOCATOR_CONFIG = "expandable_segments:True"
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # the second: torch >= 2.9's name


def configure_allocator() -> str:
    """Set expandable segments unless the user configured the allocator; returns the setting in force.
    Call before anything touches CUDA (the allocator reads it once)."""
    for name in ALLOCATOR_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_CONFIG
    return ALLOCATOR_CONFIG


def is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def release_cached_memory(device) -> None:
    """Hand the allocator's cached blocks back (after generation on gathered weights, before the update)."""
    if is_cuda(device):
        torch.cuda.empty_cache()


def reset_peaks(device) -> None:
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)


def peaks_gib(device) -> tuple[float | None, float | None]:
    """(allocated, reserved) high-water marks in GiB since the last reset_peaks; (None, None) on CPU."""
    if not is_cuda(device):
        return None, None
    return torch.cuda.max_memory_allocated(device) / GIB, torch.cuda.max_memory_reserved(device) / GIB
