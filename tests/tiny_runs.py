"""A training config small enough for tests: the tiny model on the arithmetic task, a few steps."""

from __future__ import annotations

import copy
import json
from pathlib import Path

# Timing fields differ between otherwise identical runs.
TIMING_FIELDS = {
    "train_time_s",
    "time_gen_s",
    "time_reward_s",
    "time_select_s",
    "time_update_s",
    "time_sync_s",
    "eval_time_s",
}

TINY_RUN = {
    "experiment": "test",
    "device": "cpu",
    "prompts_per_step": 4,
    "model": {
        "name": "tiny",
        "tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64},
    },
    "task": {"name": "arith", "system_prompt": "Answer in tags.", "limit": 64},
    "sampling": {"temperature": 1.0, "max_new_tokens": 12},
    "selection": {"rule": "max_variance", "n": 4, "m": 2},
    "optim": {"lr": 1e-3, "micro_batch_size": 8},
    "reward": {"workers": 0},  # grade in the main thread: no process pool to start
    "budget": {"max_steps": 3, "checkpoint_every_s": 3600},
    "eval": {"benchmarks": ["arith"], "n_problems": 6, "max_new_tokens": 12, "n_examples": 2, "inline": True},
}


def tiny_run(run_dir: Path, **sections) -> dict:
    """TINY_RUN writing to `run_dir`, with top-level keys or whole sections updated."""
    cfg = copy.deepcopy(TINY_RUN)
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    cfg["output_dir"] = str(run_dir)
    return cfg


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]
