"""The reward function against ~2,000 adversarial completions (tests/adversarial_completions.py),
graded as a trainer's reward step grades them: the real `RewardFunction`, its default pool (2 workers,
math-verify's 1 s timeouts, the hard per-item deadline), one call per trainer-sized batch.

Asserted: no exception escapes; no item takes longer than the per-item deadline; no item labelled
wrong is graded correct (false positive) and none labelled correct is graded wrong (false negative);
each batch's wall time stays under a bound computed from the config; no grading process outlives
`close()`; the injected TeX ran nowhere. `pytest -s` prints a one-line summary.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import numpy as np
import psutil
import pytest

from pods_bench.rewards import RewardConfig, RewardFunction
from tests.adversarial_completions import FAMILIES, adversarial_completions
from tests.processes import leftover_processes, still_running_after

pytestmark = pytest.mark.slow  # ~30 s on an idle 2-core machine; allow 2-3x that under load

BATCH = 256  # one reward step: 8 prompts x 32 rollouts
KILL_LATENCY_S = 1.0  # how late past the deadline the parent may notice a stuck worker and kill it
# The per-batch wall-time bound: every item stopped by a timeout may take the whole per-item
# deadline (and a kill costs a fresh worker), every other item gets NORMAL_ITEM_S, the workers share
# the load, plus BASE_S for the caller's own work (extraction and format scores over megabyte strings).
# Measured: ~7 ms per normal item; a batch with 8 timeouts takes ~5 s against a bound of ~50 s.
NORMAL_ITEM_S = 0.1
RESTART_S = 5.0
BASE_S = 5.0


def batch_bound_s(config: RewardConfig, n_items: int, n_stopped: int, n_killed: int) -> float:
    work = n_stopped * config.item_deadline_s + (n_items - n_stopped) * NORMAL_ITEM_S
    return BASE_S + work / config.workers + n_killed * RESTART_S


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_adversarial_completions_are_graded_safely(tmp_path):
    marker = tmp_path / "written-by-tex"
    cases = adversarial_completions(seed=0, marker=str(marker))
    families = Counter(c.family for c in cases)
    assert len(cases) >= 1000 and set(families) == set(FAMILIES)
    order = list(range(len(cases)))
    random.Random(0).shuffle(order)  # adversarial items spread over the batches, as in training
    batches = [order[s : s + BATCH] for s in range(0, len(order), BATCH)]

    config = RewardConfig(workers=2)  # the defaults otherwise: 1 s math-verify timeouts, 8 s deadline
    before = {p.pid for p in leftover_processes()}
    crashes, over_bound, graded, batch_times = [], [], {}, []
    timeouts = killed = errors = 0
    started = time.monotonic()
    with RewardFunction(config) as reward:
        reward(["<answer>0</answer>"], ["0"])  # the trainer starts the pool before its first step
        workers_seen = set(reward.worker_pids())
        for batch in batches:
            batch_started = time.monotonic()
            try:
                result = reward([cases[i].completion for i in batch], [cases[i].gold for i in batch])
            except Exception as e:  # a crash: recorded, then asserted on below
                crashes.append(f"{type(e).__name__}: {e}"[:300])
                continue
            wall = time.monotonic() - batch_started
            bound = batch_bound_s(config, len(batch), result.n_timeouts, result.n_killed)
            batch_times.append((wall, bound))
            if wall > bound:
                over_bound.append(
                    f"{wall:.1f} s > {bound:.1f} s ({result.n_timeouts} timeouts, {result.n_killed} killed)"
                )
            assert len(result.total) == len(batch)
            assert set(np.unique(result.correctness)) <= {0.0, 1.0}
            assert np.all((result.total >= 0) & (result.total <= 1.2 + 1e-9))
            for i, score, seconds in zip(batch, result.correctness, result.seconds):
                graded[i] = (score, seconds)
            timeouts, killed, errors = timeouts + result.n_timeouts, killed + result.n_killed, errors + result.n_errors
            workers_seen |= set(reward.worker_pids())
        restarts = reward.worker_restarts
    total_s = time.monotonic() - started

    false_positives = [cases[i] for i, (score, _) in graded.items() if score == 1 and not cases[i].correct]
    false_negatives = [cases[i] for i, (score, _) in graded.items() if score == 0 and cases[i].correct]
    slowest = max(graded.items(), key=lambda kv: kv[1][1], default=(0, (0.0, 0.0)))
    closest = max(batch_times, key=lambda wb: wb[0] / wb[1], default=(0.0, 0.0))
    print(
        f"\nadversarial rewards: {len(cases)} items, families {dict(families)}, {len(crashes)} crashes, "
        f"{timeouts} timeouts, {killed} deadline kills, {errors} verifier errors, {len(false_positives)} false positives, "
        f"{len(false_negatives)} false negatives, slowest item {slowest[1][1]:.2f} s ({cases[slowest[0]].family}), "
        f"closest batch of {BATCH} to its bound {closest[0]:.1f} s of {closest[1]:.1f} s, "
        f"total {total_s:.1f} s"
    )

    assert crashes == []
    assert len(graded) == len(cases)
    assert slowest[1][1] <= config.item_deadline_s + KILL_LATENCY_S, cases[slowest[0]].short()
    assert [c.short() for c in false_positives] == []
    assert [f"{c.short()} {c.why}" for c in false_negatives] == []
    assert over_bound == []
    # The slow families do reach math-verify's timeouts (so they are seen and counted), but stay a
    # minority, as the runtime of this test needs.
    assert 10 <= timeouts <= len(cases) // 20
    assert restarts == killed  # no worker died other than by the deadline
    assert still_running_after(lambda: [p for p in leftover_processes() if p.pid not in before], 20.0) == []
    assert [pid for pid in workers_seen if alive(pid)] == []
    assert not marker.exists()  # \write18 and \openout payloads name this file: nothing ran them
