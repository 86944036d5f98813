"""The peer benchmark's summary arithmetic (tests/benchmarks/peer_trl.py) on hand-made pairs: the
ratio is pods-bench over TRL, its interval brackets the median, wider spreads give wider intervals."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.benchmarks.peer_trl import median_interval, phase_ratios, summary


def pair(ours: float, theirs: float) -> dict:
    side = lambda step: {"generation": step / 2, "update": step / 2, "step": step, "completion_len_mean": 16.0,
                         "reward_mean": 0.25}  # fmt: skip
    phases = ("generation", "update", "step")
    return {"pods-bench": side(ours), "trl": side(theirs), "ratio": {k: ours / theirs for k in phases},
            "load_before": 1.0, "load_after": 1.0}  # fmt: skip


def test_the_interval_is_a_percentile_interval_of_bootstrap_medians():
    values = [0.8, 0.9, 1.0, 1.1, 1.2, 0.95, 1.05, 1.0]
    low, high = median_interval(values, seed=0)
    rng = np.random.default_rng(7)  # other draws: the same interval within resampling noise
    medians = np.median(rng.choice(values, size=(20_000, len(values))), axis=1)
    assert (low, high) == pytest.approx(tuple(np.percentile(medians, [2.5, 97.5])), abs=0.03)
    assert low <= float(np.median(values)) <= high
    assert median_interval([1.0] * 8) == (1.0, 1.0)


def test_the_summary_row_is_pods_bench_over_trl_with_its_interval():
    pairs = [pair(1.0, 2.0), pair(1.2, 2.0), pair(0.8, 2.0), pair(1.0, 2.5)]  # ratios 0.5, 0.6, 0.4, 0.4
    text = summary(pairs, steps=3)
    row = next(line for line in text.splitlines() if line.startswith("| step |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["1.000", "2.000", "0.450"]  # medians: pods-bench 1.0 s, TRL 2.0 s, ratio 0.45
    assert cells[4] == "0.400-0.600"
    low, high = map(float, re.findall(r"[\d.]+", cells[5]))
    assert low <= 0.45 <= high and (low, high) == pytest.approx(median_interval([0.5, 0.6, 0.4, 0.4]), abs=5e-4)


def test_each_pair_s_ratio_is_pods_bench_seconds_over_trl_seconds():
    # pods-bench 1 s to generate and 3 s to update, TRL 4 s and 2 s: 1/4, 3/2 and (1+3)/(4+2) = 2/3
    ours = {"generation": 1.0, "update": 3.0, "step": 4.0}
    theirs = {"generation": 4.0, "update": 2.0, "step": 6.0}
    assert phase_ratios(ours, theirs) == pytest.approx({"generation": 0.25, "update": 1.5, "step": 2 / 3})


def test_the_interval_is_low_then_high_around_a_skewed_median():
    # ratios clustered at 1.0 with two slow pairs: the medians resampled lie between 1.0 and 1.5, so
    # the interval's lower end is 1.0 and its upper one above it (swapped percentiles would give high < low)
    low, high = median_interval([1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 3.0], seed=0)
    assert low == 1.0 and 1.0 < high <= 2.0
