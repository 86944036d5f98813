"""What `loss.reference_forward` costs: the paper's single-GPU trainer makes a reference pass over
the kept rollouts every step, even at beta 0. One process, one LoRA learner, the same kept rollouts:
rounds alternate the update with and without the pass (the order flips every round), each timed in
process CPU time, which a busy shared machine disturbs far less than wall time; a generation call
of the same step is timed beside them, so that the step's share can be given too.

    python -m tests.benchmarks.reference_forward [--rounds 20]

Prints the per-round update times, the ratio with / without (median, range, 95 % bootstrap interval
of the median) and the step ratio (generation + update with) / (generation + update without); the
weights and log of a run are unchanged by the pass (tests/test_train.py).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from tests.tiny_runs import tiny_run

PROMPTS, N, M = 4, 16, 4


def settings(folder: Path) -> dict:
    return tiny_run(
        folder,
        model={
            "tiny": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 384}
        },
        task={"name": "arith", "system_prompt": "", "limit": 64},
        sampling={"temperature": 1.0, "max_new_tokens": 24},
        selection={"rule": "max_variance", "n": N, "m": M},
        lora={"enabled": True, "r": 8, "alpha": 16},
        optim={"lr": 1e-4, "micro_batch_size": 16},
        budget={"max_steps": 1},
    )


def cpu_seconds(fn) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def measure(rounds: int) -> list[dict]:
    from pods_bench.config import config_from_dict
    from pods_bench.engines import make_engine
    from pods_bench.sampling import load_training_prompts
    from pods_bench.train import make_accelerator
    from pods_bench.update import KeptRollout, make_learner, update_policy

    with tempfile.TemporaryDirectory() as tmp:
        plain = config_from_dict(settings(Path(tmp)))
        paid = replace(plain, loss=replace(plain.loss, reference_forward=True))
        learner, tokenizer = make_learner(plain, make_accelerator(plain), None)
        _, prompts, _ = load_training_prompts(plain.task, plain.data_dir, tokenizer)
        engine = make_engine(plain, learner.policy, tokenizer)
        sampling = replace(plain.sampling, seed=0)
        generate = lambda: engine.generate(prompts[:PROMPTS], N, sampling)  # noqa: E731
        rollouts = generate()
        advantages = np.random.default_rng(0).standard_normal(PROMPTS * M)
        kept = [
            KeptRollout(rollouts.prompt_ids[p], rollouts.completion_ids[p][j], float(advantages[p * M + j]))
            for p in range(PROMPTS)
            for j in range(M)
        ]
        for cfg in (plain, paid):  # warm-up
            update_policy(learner, kept, cfg)
        rows = []
        for r in range(rounds):
            times = {}
            for name, cfg in (("without", plain), ("with", paid))[:: 1 if r % 2 == 0 else -1]:
                times[name] = cpu_seconds(lambda cfg=cfg: update_policy(learner, kept, cfg))
            gen = cpu_seconds(generate)
            rows.append(
                {
                    "round": r + 1,
                    "first": "without" if r % 2 == 0 else "with",
                    "generation_s": gen,
                    "update_without_s": times["without"],
                    "update_with_s": times["with"],
                    "update_ratio": times["with"] / times["without"],
                    "step_ratio": (gen + times["with"]) / (gen + times["without"]),
                }
            )
        engine.close()
    return rows


def median_interval(values: list[float], seed: int = 0, draws: int = 10_000) -> tuple[float, float]:
    """95 % bootstrap interval of the median over rounds."""
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(values, size=(draws, len(values)), replace=True), axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def report(rows: list[dict]) -> str:
    lines = [
        f"{PROMPTS} prompts x n = {N}, m = {M} kept, LoRA on a 0.8M-parameter Llama; process CPU seconds",
        "",
        "| ratio (with / without the reference pass) | median | range | 95 % CI of the median |",
        "| --- | --- | --- | --- |",
    ]
    for name in ("update_ratio", "step_ratio"):
        values = [r[name] for r in rows]
        low, high = median_interval(values)
        lines.append(
            f"| {name.split('_')[0]} | {statistics.median(values):.3f} | {min(values):.3f}-{max(values):.3f} | "
            f"[{low:.3f}, {high:.3f}] |"
        )
    medians = {k: statistics.median(r[k] for r in rows) for k in ("generation_s", "update_without_s", "update_with_s")}
    lines.append(
        f"\n{len(rows)} rounds, order alternating; medians: generation {medians['generation_s']:.3f} s, update "
        f"{medians['update_without_s']:.3f} s without, {medians['update_with_s']:.3f} s with the pass"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)  # CPU time of one thread: the ratio, not the speed, is what is reported
    print(report(measure(args.rounds)))
