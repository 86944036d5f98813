"""Several independent groups per prompt (`selection.groups_per_prompt`, the paper's 8-GPU runs):
each prompt is sampled G x n times, the rewards form G rows of n, and every row is selected n -> m and
normalised on its own (open-r1 grpo_trainer.py at 9459b96: RepeatSampler mini_repeat_count = n x gas,
rewards viewed (-1, n), PODS and advantages per row)."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
import torch

import pods_bench.selection as selection
import pods_bench.train as trainer
from pods_bench.config import config_from_dict
from pods_bench.errors import PodsBenchError
from tests.tiny_runs import read_lines, tiny_run

P, G, N, M = 2, 3, 4, 2


def test_each_group_is_selected_and_normalised_on_its_own(tmp_path, monkeypatch):
    seen = {"select": [], "advantages": [], "sequences": []}
    real_select, real_advantages, real_update = selection.select, selection.group_advantages, trainer.update_policy

    def spy_select(rule, rewards, m, generator=None, settings=None):
        seen["select"].append(rewards.clone())
        return real_select(rule, rewards, m, generator, settings)

    def spy_advantages(rewards, **kwargs):
        out = real_advantages(rewards, **kwargs)
        seen["advantages"].append((rewards.clone(), out.clone()))
        return out

    def spy_update(learner, sequences, cfg):
        seen["sequences"].append(sequences)
        return real_update(learner, sequences, cfg)

    monkeypatch.setattr(selection, "select", spy_select)
    monkeypatch.setattr(selection, "group_advantages", spy_advantages)
    monkeypatch.setattr(trainer, "update_policy", spy_update)
    cfg = config_from_dict(
        tiny_run(
            tmp_path / "run",
            prompts_per_step=P,
            budget={"max_steps": 2},
            selection={"rule": "max_variance", "n": N, "m": M, "groups_per_prompt": G},
            eval={"inline": False},
        )
    )
    seen["select"].clear()  # the config check's own trial call
    trainer.train(cfg, progress=False)

    assert [tuple(r.shape) for r in seen["select"]] == [(P * G, N)] * 2  # G rows of n per prompt
    assert len(seen["advantages"]) == len(seen["sequences"]) == 2  # one of each per step: the loops below run
    rows_checked = pooled_differs = 0
    for step, (rewards, advantages) in enumerate(seen["advantages"]):
        assert tuple(rewards.shape) == (P * G, M)
        expected_rows = []
        for row in range(P * G):
            # the kept m of this row are the max-variance m of the same row's n rewards, found here by
            # trying every m-subset (statistics.pvariance: the population variance; any variance ranks alike)
            sampled = seen["select"][step][row].tolist()
            best = max(itertools.combinations(sampled, M), key=statistics.pvariance)
            assert sorted(rewards[row].tolist()) == sorted(best), (step, row, sampled, rewards[row])
            # each row normalised with its own mean and unbiased std over its m kept rewards, written out
            # here rather than by a second call of the function under test: A = (r - mean) / (std + 1e-4)
            r = rewards[row].tolist()
            mean = sum(r) / M
            std = math.sqrt(sum((x - mean) ** 2 for x in r) / (M - 1))
            expected = [0.0] * M if len(set(r)) == 1 else [(x - mean) / (std + 1e-4) for x in r]
            assert advantages[row].tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12), (step, row)
            expected_rows.append(expected)
            rows_checked += 1
        # the update trains on each row's own advantages, rows in order, the m of a row consecutive
        trained = [s.advantage for s in seen["sequences"][step]]
        assert trained == pytest.approx([a for e in expected_rows for a in e], rel=1e-12, abs=1e-12)
        # pooled over the batch instead of per row would differ wherever rows differ in mean
        if len({float(r.mean()) for r in rewards}) > 1:
            pooled = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
            assert not torch.allclose(advantages, pooled)
            pooled_differs += 1
    assert rows_checked == 2 * P * G
    assert pooled_differs >= 1, "no step had rows of different means: the per-row check proved nothing"
    for sequences in seen["sequences"]:
        assert len(sequences) == P * G * M
        prompts = [tuple(s.prompt_ids) for s in sequences]
        for p in range(P):  # the G groups of one prompt are consecutive and share the prompt
            assert len(set(prompts[p * G * M : (p + 1) * G * M])) == 1
    records = read_lines(tmp_path / "run/train_log.jsonl")
    assert [(r["prompts"], r["groups_per_prompt"], r["n"], r["m"]) for r in records] == [(P, G, N, M)] * 2


def test_groups_per_prompt_must_be_positive(tmp_path):
    with pytest.raises(PodsBenchError, match="selection.groups_per_prompt must be >= 1"):
        config_from_dict(tiny_run(tmp_path, selection={"groups_per_prompt": 0}))
