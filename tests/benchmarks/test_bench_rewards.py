"""Verifier throughput: completions graded per second by `RewardFunction`, side by side in one run.

Workload: one GRPO step's worth of rollouts, 32 prompts (16 GSM8K test, 16 MATH-500) x 16
completions in the paper's `<think>`/`<answer>` format; about a third correct (the gold, written
as the model would), the rest wrong answers drawn fresh for every round so math-verify's parse cache
does not flatter the numbers. Each gold appears 16 times, as in training.

    workers=0   graded in the calling process (no pool)
    workers=1   one grading process
    workers=2   two grading processes (the default on a 2-core machine)

    pytest -q -m benchmark --benchmark-enable tests/benchmarks/test_bench_rewards.py
    python -m tests.benchmarks.test_bench_rewards     # items/s side by side, one run

With benchmarks disabled (the default test run) each case runs once and checks every grade.
"""

from __future__ import annotations

import random
import statistics
import time

import pytest

from pods_bench.rewards import RewardConfig, RewardFunction
from pods_bench.tasks import load_problems

PROMPTS_PER_TASK, N = 16, 16
WORKERS = (0, 1, 2)

pytestmark = pytest.mark.benchmark


def rollouts(data_dir, seed: int) -> tuple[list[str], list[str], list[int]]:
    """(completions, golds, expected correctness) for one step."""
    rng = random.Random(seed)
    problems = [p for task in ("gsm8k", "math500") for p in load_problems(task, "test", data_dir, PROMPTS_PER_TASK)]
    completions, golds, expected = [], [], []
    for p in problems:
        for _ in range(N):
            correct = rng.random() < 0.35
            big = rng.randint(10**6, 10**7)  # no gold is this
            answer = p.gold if correct else rng.choice([str(big), rf"\frac{{{big}}}{{7}}", f"{big}.5"])
            body = rng.choice(
                [
                    f"<answer>\n{answer}\n</answer>",
                    f"<answer>\n\\boxed{{{answer}}}\n</answer>",
                    f"so it is $\\boxed{{{answer}}}$.",
                ]
            )
            completions.append(f"<think>\nLet me work through it step by step.\n</think>\n{body}")
            golds.append(p.gold)
            expected.append(int(correct))
    return completions, golds, expected


@pytest.mark.parametrize("workers", WORKERS, ids=lambda w: f"workers={w}")
def test_bench_verifier_throughput(benchmark, data_dir, workers):
    seeds = iter(range(1000))
    rates = []

    def one_step():
        completions, golds, expected = rollouts(data_dir, next(seeds))
        return (reward, completions, golds, expected), {}

    def grade(reward, completions, golds, expected):
        started = time.perf_counter()
        result = reward(completions, golds)
        rates.append(len(completions) / (time.perf_counter() - started))
        # under a loaded machine a 1 s math-verify timeout can hit a slow parse: only those may differ
        assert sum(got != want for got, want in zip(result.correctness, expected)) <= result.n_timeouts

    with RewardFunction(RewardConfig(workers=workers)) as reward:
        reward(["<answer>1</answer>"], ["1"])  # start the pool outside the timing
        benchmark.pedantic(grade, setup=one_step, rounds=5, iterations=1)
    benchmark.extra_info["items_per_step"] = PROMPTS_PER_TASK * 2 * N
    benchmark.extra_info["items_per_s"] = round(statistics.median(rates), 1)


def main(rounds: int = 5) -> None:
    from tests.conftest import DATA_DIR

    print(f"{'workers':>8} {'items/s (median of ' + str(rounds) + ')':>26}")
    for workers in WORKERS:
        with RewardFunction(RewardConfig(workers=workers)) as reward:
            reward(["<answer>1</answer>"], ["1"])
            rates = []
            for seed in range(rounds):
                completions, golds, _ = rollouts(DATA_DIR, seed)
                started = time.perf_counter()
                reward(completions, golds)
                rates.append(len(completions) / (time.perf_counter() - started))
        print(f"{workers:>8} {statistics.median(rates):>26.0f}")


if __name__ == "__main__":
    main()
