"""The update's memory measured on this machine beside the plan's count (`pods-bench profile --memory`).

One arm at a time, in a fresh process: its model, adapters, optimizer and accelerator built as the
trainer builds them (train.make_learner), then two policy updates (train.update_policy) on the arm's
kept rows, every row exactly the plan's worst case (a prompt of task.max_prompt_tokens and a
completion of sampling.max_new_tokens tokens; the ids are random, since memory depends on shapes
only). The measurement is the resident set's high-water mark during the second update (AdamW's state
exists by then, as on every step after the first) above the resting process; the plan's number is its
update phase beyond what persists between steps: gradients + activations + the log-prob chunk + the
autocast copy (planning/memory.py).

Linux only: /proc/self/clear_refs resets the high-water mark (VmHWM). glibc's mmap threshold is fixed
(MALLOC_MMAP_THRESHOLD_) so that freed blocks go back to the system and the resident set follows
what torch holds; without it glibc keeps freed memory and the peak includes earlier phases.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from pods_bench.config import config_from_dict
from pods_bench.errors import PodsBenchError
from pods_bench.planning.architecture import model_dims
from pods_bench.planning.memory import memory_estimate, trained_per_process
from pods_bench.train import make_accelerator
from pods_bench.update import KeptRollout, make_learner, update_policy

CLEAR_REFS = Path("/proc/self/clear_refs")
FRESH_PROCESS_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}


def planned_update_bytes(cfg) -> int:
    """The plan's update phase beyond the persistent weights and optimizer state (one process, the
    config's limits as lengths)."""
    hardware = {"accelerator": {"framework_overhead_gb": 0.0, "memory_gib": 1e6}, "processes": 1, "device": "cpu"}
    parts = memory_estimate(cfg, model_dims(cfg.model), hardware)["parts"]
    return parts["gradients"] + parts["activations"] + parts["autocast_cache"] + parts["gathered_units"]


def _status_bytes(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(key + r":\s+(\d+) kB", text).group(1)) * 1024


def measure_here(cfg) -> dict:
    """{"measured": bytes, "planned": bytes, "rows", "prompt", "completion"} in this process (call it
    in a fresh one: `measure_update`)."""
    torch.set_num_threads(1)
    accelerator = make_accelerator(cfg)
    learner, tokenizer = make_learner(cfg, accelerator, None)
    rows = trained_per_process(cfg, 1)
    prompt, completion = cfg.task.max_prompt_tokens, cfg.sampling.max_new_tokens
    ids = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    draw = lambda n: torch.randint(3, vocab, (n,), generator=ids).tolist()  # past the special tokens
    rollouts = [KeptRollout(draw(prompt), draw(completion), float(i % 2) - 0.5) for i in range(rows)]
    update_policy(learner, rollouts, cfg)  # the optimizer state exists from here on
    learner.optimizer.zero_grad(set_to_none=True)
    resting = _status_bytes("VmRSS")
    CLEAR_REFS.write_text("5")  # resets the high-water mark (VmHWM) to the current resident set
    update_policy(learner, rollouts, cfg)
    measured = _status_bytes("VmHWM") - resting
    return {
        "measured": measured,
        "planned": planned_update_bytes(cfg),
        "rows": rows,
        "prompt": prompt,
        "completion": completion,
    }


def measure_update(settings: dict, overrides: list[str], timeout_s: float = 1800) -> dict:
    """measure_here for the trainer config (settings + dotted overrides) in a fresh process."""
    if not CLEAR_REFS.exists():
        raise PodsBenchError("measuring update memory needs Linux's /proc/self/clear_refs (peak-RSS reset)")
    out = subprocess.run(
        [sys.executable, "-m", "pods_bench.planning.measure_memory", json.dumps([settings, overrides])],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **FRESH_PROCESS_ENV},
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise PodsBenchError(f"the update-memory measurement failed: {last}")
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # the fresh process of measure_update
    settings, overrides = json.loads(sys.argv[1])
    print(json.dumps(measure_here(config_from_dict(settings, overrides))))
