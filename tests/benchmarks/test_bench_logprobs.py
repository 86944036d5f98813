"""The smoke update with chunked log-probs (pods_bench/logprobs.py) beside the plain full-logits
formula, measured side by side: interleaved pairs, the order alternated, the ratio of medians.

Workload: GRPO's update on the smoke task, 8 prompts x 16 completions (128 rows) of the smoke model
(hidden 128, 4 layers, character vocabulary), prompts of 20 tokens and completions of 32, one
forward and backward pass. Goal: the chunked path costs at most 5 % more (ratio <= 1.05).
Run with `make bench`; skipped in the plain test run because it measures, it does not test.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from pods_bench.checkpoint import load_policy
from pods_bench.config import ModelConfig, TrainConfig
from pods_bench.update import KeptRollout, completion_logprobs, pack
from tests.test_logprobs import plain_logprobs

pytestmark = pytest.mark.benchmark
PAIRS = 20


def test_chunked_log_probs_cost_at_most_5_percent_more_than_the_full_logits(request):
    options = request.config.getoption
    if options("benchmark_disable", False) and not options("benchmark_enable", False):
        pytest.skip("the ratio is measured only with --benchmark-enable")
    torch.set_num_threads(1)  # one thread: a busy machine slows a multi-threaded pass by more than the difference
    model, tokenizer = load_policy(TrainConfig(model=ModelConfig(name="tiny")))
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    rows = [
        KeptRollout(
            torch.randint(4, vocab, (20,), generator=g).tolist(),
            torch.randint(4, vocab, (32,), generator=g).tolist(),
            1.0,
        )
        for _ in range(128)
    ]
    batch = pack(rows, tokenizer.pad_token_id, "cpu")
    mask = batch["completion_mask"]
    paths = {
        "chunked": lambda: completion_logprobs(model, batch, 1.0, chunk_tokens=1024),
        "plain": lambda: plain_logprobs(model, batch, 1.0),
    }

    def timed_pass(path: str) -> float:
        started = time.perf_counter()
        loss = -(paths[path]() * batch["advantages"].unsqueeze(1))[mask].mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    for path in paths:  # warm-up
        timed_pass(path)
    times = {path: [] for path in paths}
    for pair in range(PAIRS):
        order = ("chunked", "plain") if pair % 2 == 0 else ("plain", "chunked")
        for path in order:
            times[path].append(timed_pass(path))
    ratios = [c / p for c, p in zip(times["chunked"], times["plain"])]
    ratio = statistics.median(times["chunked"]) / statistics.median(times["plain"])
    print(
        f"\nsmoke update (128 rows x 52 tokens, fwd+bwd), median of {PAIRS} interleaved pairs: chunked "
        f"{statistics.median(times['chunked']) * 1e3:.1f} ms, plain {statistics.median(times['plain']) * 1e3:.1f} ms, "
        f"ratio {ratio:.3f} (pairs: min {min(ratios):.3f}, max {max(ratios):.3f}; goal <= 1.05)"
    )
    assert ratio <= 1.05
