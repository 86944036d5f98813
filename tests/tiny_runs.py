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


class StepWitness:
    """Each training step's work, counted outside the code under test: the completions the engine
    handed back while the step ran (not the sampler's counters) and the rows `update_policy` was
    given to train on (not the log's arithmetic). Generation outside a step (the engines' warm-up,
    evaluation) is not counted. Install with `StepWitness(monkeypatch)` before `train` runs."""

    def __init__(self, monkeypatch):
        import pods_bench.train as trainer
        from pods_bench.engines.hf import HFEngine

        self.steps: list[dict] = []
        inside: list[bool] = []
        real_step, real_update, real_generate = trainer.train_step, trainer.update_policy, HFEngine.generate

        def train_step(*args, **kwargs):
            self.steps.append(
                {
                    "rollouts": 0,
                    "generated_tokens": 0,
                    "trained_rows": 0,
                    "trained_tokens": 0,
                    "rows_per_prompt": {},
                    "generated": [],  # (prompt length, [completion lengths]) of each group generated
                    "trained_lengths": [],  # prompt + completion tokens of each sequence trained
                    "sampled": [],  # (prompt ids, completion ids) of each completion generated
                    "trained": [],  # (prompt ids, completion ids) of each sequence trained
                }
            )
            inside.append(True)
            try:
                return real_step(*args, **kwargs)
            finally:
                inside.pop()

        def generate(engine, prompts, n, sampling):
            rollouts = real_generate(engine, prompts, n, sampling)
            if inside:
                step = self.steps[-1]
                step["rollouts"] += sum(len(group) for group in rollouts.completion_ids)
                step["generated_tokens"] += sum(len(c) for group in rollouts.completion_ids for c in group)
                step["sampled"] += [
                    (tuple(p), tuple(c))
                    for p, group in zip(rollouts.prompt_ids, rollouts.completion_ids)
                    for c in group
                ]
                step["generated"] += [
                    (len(p), [len(c) for c in group]) for p, group in zip(rollouts.prompt_ids, rollouts.completion_ids)
                ]
            return rollouts

        def update_policy(learner, sequences, *args, **kwargs):
            step = self.steps[-1]
            step["trained_rows"] += len(sequences)
            step["trained_tokens"] += sum(len(s.completion_ids) for s in sequences)
            step["trained_lengths"] += [len(s.prompt_ids) + len(s.completion_ids) for s in sequences]
            step["trained"] += [(tuple(s.prompt_ids), tuple(s.completion_ids)) for s in sequences]
            for s in sequences:
                key = tuple(s.prompt_ids)
                step["rows_per_prompt"][key] = step["rows_per_prompt"].get(key, 0) + 1
            return real_update(learner, sequences, *args, **kwargs)

        monkeypatch.setattr(trainer, "train_step", train_step)
        monkeypatch.setattr(trainer, "update_policy", update_policy)
        monkeypatch.setattr(HFEngine, "generate", generate)
