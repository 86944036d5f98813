"""Every allocation strategy really trains: the warm-started smoke model on the arithmetic task (pass
rates spread between 0 and 1, so groups are all-correct, all-wrong and mixed), sampled by the HF
engine, graded by math-verify. And a run resumed from a checkpoint continues exactly as a straight
run, per-prompt state included (Pilot-Commit's buffer and evicted set, GRESO's streaks and p)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest
import torch

from pods_bench.config import config_from_dict
from pods_bench.train import train
from tests.tiny_runs import StepWitness, read_lines, tiny_run, without_timings

pytestmark = pytest.mark.slow

STRATEGIES = {
    "dynamic_sampling": {"dynamic_sampling": {"prompts_per_round": 6}},
    "greso": {"greso": {"prompts_per_round": 6}},
    "pilot_commit": {"pilot_commit": {"pilot_prompts": 6, "pilot_rollouts": 4}},
}


def run(run_dir, model_dir, strategy: str, steps: int, **sections):
    settings = dict(
        model={"name": str(model_dir)},
        task={"name": "arith", "system_prompt": "", "limit": 24},  # several epochs: streaks, evictions
        sampling={"temperature": 1.0, "max_new_tokens": 24},
        selection={"rule": "max_variance", "n": 8, "m": 4},
        allocation={"strategy": strategy, **STRATEGIES.get(strategy, {})},
        optim={"lr": 1e-4, "micro_batch_size": 32},
        budget={"max_steps": steps, "checkpoint_every_s": 3600, "checkpoint_every_steps": 3},
        eval={"inline": False},
    )
    cfg = tiny_run(run_dir, **(settings | sections))
    return train(config_from_dict(cfg), progress=False)


def check_counts_against_the_witness(steps: list[dict], witness: StepWitness, rows_per_group: int) -> None:
    """The log's cost and work fields equal what the engine returned and what the update was given;
    every trained group contributes `rows_per_group` rows."""
    assert len(witness.steps) == len(steps)
    for r, seen in zip(steps, witness.steps):
        assert r["rollouts_generated"] == seen["rollouts"] > 0
        assert r["generated_tokens"] == seen["generated_tokens"] > 0
        assert r["completion_len_mean"] == pytest.approx(seen["generated_tokens"] / seen["rollouts"])
        assert r["trained_tokens"] == seen["trained_tokens"] > 0
        assert seen["trained_rows"] == r["groups_trained"] * rows_per_group
        # each group trains rows_per_group rows (a prompt may train as two groups: committed, then re-piloted)
        assert all(count % rows_per_group == 0 for count in seen["rows_per_prompt"].values())


@pytest.mark.parametrize("strategy", ["dynamic_sampling", "greso", "pilot_commit"])
def test_every_strategy_trains_and_logs_what_it_spent(tmp_path, smoke_model_dir, strategy, monkeypatch):
    witness = StepWitness(monkeypatch)
    steps = read_lines(run(tmp_path / strategy, smoke_model_dir, strategy, 6) / "train_log.jsonl")
    assert [r["step"] for r in steps] == list(range(1, 7))
    check_counts_against_the_witness(steps, witness, rows_per_group=4)  # m = 4 of each group's n = 8
    for r in steps:
        assert r["allocation"] == strategy and r["num_gen_batches"] >= 1
        assert r["groups_trained"] == 4 and r["prompts_kept"] == 4  # a full batch of P groups
        assert r["grad_norm"] > 0
    if strategy in ("dynamic_sampling", "greso"):
        # every trained group was sampled in this step (n rollouts each), and dropped groups cost rollouts
        assert all(r["rollouts_generated"] == 8 * r["groups_sampled"] >= 8 * r["groups_trained"] for r in steps)
        # only groups whose rewards differ train (the filter dropped the others)
        assert all(r["frac_reward_zero_std"] == 0 for r in steps)
        assert sum(r["groups_discarded_zero_std"] for r in steps) > 0
        # what was not trained: the discarded groups' n rollouts each, and n - m of every trained group
        for r in steps:
            discarded = r["groups_discarded_zero_std"] + r["groups_discarded_surplus"]
            assert r["groups_sampled"] == r["groups_trained"] + discarded
            assert r["rollouts_not_trained"] == 8 * discarded + (8 - 4) * r["groups_trained"]
    if strategy == "greso":
        assert sum(r["prompts_skipped"] for r in steps) > 0  # streaks from the first epoch skip prompts later
    if strategy == "pilot_commit":
        assert all(r["rollouts_pilot"] + r["rollouts_commit"] == r["rollouts_generated"] for r in steps)
        # a committed group trains on its 4 pilot rollouts (sampled earlier) and 4 committed now
        assert all(r["rollouts_commit"] == 4 * r["groups_trained"] for r in steps)
        assert sum(r["prompts_buffered"] for r in steps) >= 4 * len(steps)  # every committed prompt was buffered
        assert sum(r["commit_age_mean"] or 0 for r in steps) > 0  # pilots from earlier steps were committed


@pytest.mark.parametrize("rule", ["all", "random"])
@pytest.mark.parametrize("strategy", ["dynamic_sampling", "greso", "pilot_commit"])
def test_every_strategy_trains_with_other_selection_rules(tmp_path, smoke_model_dir, strategy, rule, monkeypatch):
    """The strategies compose with the selection rules: with `all` every group trains all n = 8 of its
    rollouts, with `random` m = 4 of them (max_variance: the test above)."""
    witness = StepWitness(monkeypatch)
    m = 8 if rule == "all" else 4
    selection = {"rule": rule, "n": 8, "m": m}
    steps = read_lines(run(tmp_path / rule, smoke_model_dir, strategy, 3, selection=selection) / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3]
    check_counts_against_the_witness(steps, witness, rows_per_group=m)
    assert all(r["groups_trained"] == 4 and r["grad_norm"] > 0 and r["m"] == m for r in steps)


@pytest.mark.parametrize("strategy", ["vigor", "hora"])
def test_strategies_with_groups_of_different_sizes_train_every_rollout(
    tmp_path, smoke_model_dir, strategy, monkeypatch
):
    """VIGOR (8 prompts: groups of 2, 2, 2, 2, 6, 6, 14, 30) and HORA (4 prompts, a probe of 4, the
    other 16 rollouts by hit utility) spend P x n rollouts a step and, with rule "all", train on every
    one of them, groups of different sizes in one update; a resumed run replays the steps exactly."""
    witness = StepWitness(monkeypatch)
    P = 8 if strategy == "vigor" else 4
    sections = dict(prompts_per_step=P, selection={"rule": "all", "n": 8, "m": 8})
    steps = read_lines(run(tmp_path / "straight", smoke_model_dir, strategy, 3, **sections) / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r, seen in zip(steps, witness.steps):
        assert r["rollouts_generated"] == seen["rollouts"] == r["rollouts_in_groups"] == P * 8
        assert seen["trained_rows"] == P * 8 and r["trained_tokens"] == seen["trained_tokens"]
        assert r["groups_trained"] == P and r["grad_norm"] > 0
    assert any(r["group_size_min"] < r["group_size_max"] for r in steps)
    # the FLOPs by phase, recounted from the witnessed sequences (pods_bench/flops.py's convention)
    from transformers import AutoModelForCausalLM

    from pods_bench.flops import FlopsCounter

    counter = FlopsCounter.of(
        AutoModelForCausalLM.from_pretrained(smoke_model_dir), config_from_dict({"budget": {"max_steps": 1}})
    )
    for r, seen in zip(steps, witness.steps):
        assert r["flops_gen"] == pytest.approx(sum(counter.generation(p, c) for p, c in seen["generated"]))
        assert r["flops_update"] == pytest.approx(3 * sum(counter.forward(t) for t in seen["trained_lengths"]))
        assert r["flops_reference"] == r["flops_reward"] == 0 and r["flops_gen"] > 0
    if strategy == "vigor":
        assert all(sorted(seen["rows_per_prompt"].values()) == [2, 2, 2, 2, 6, 6, 14, 30] for seen in witness.steps)
    else:  # the sizes follow the probes' outcomes
        assert len({tuple(sorted(seen["rows_per_prompt"].values())) for seen in witness.steps}) > 1
    run(tmp_path / "resumed", smoke_model_dir, strategy, 2, **sections)  # ends with a checkpoint at step 2
    run(tmp_path / "resumed", smoke_model_dir, strategy, 3, **sections)
    logs = [without_timings(read_lines(tmp_path / d / "train_log.jsonl")) for d in ("straight", "resumed")]
    assert logs[0] == logs[1]


@pytest.mark.parametrize("strategy", ["vigor", "hora"])
def test_a_step_that_draws_a_prompt_twice_trains_each_slot_as_its_own_group(
    tmp_path, smoke_model_dir, strategy, monkeypatch
):
    """12 training prompts, 8 a step: step 2's draw crosses the epoch boundary and holds a prompt
    twice; each drawn slot is a group of its own, and every rollout sampled trains exactly once (the
    multiset of sequences trained is the multiset generated: the smoke model repeats completions)."""
    witness = StepWitness(monkeypatch)
    sections = dict(
        task={"name": "arith-mix", "system_prompt": "", "limit": 12},
        prompts_per_step=8,
        selection={"rule": "all", "n": 8, "m": 8},
    )
    steps = read_lines(run(tmp_path / strategy, smoke_model_dir, strategy, 2, **sections) / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2]
    assert len(witness.steps[1]["rows_per_prompt"]) < 8  # the premise: step 2 drew a prompt twice
    for r, seen in zip(steps, witness.steps):
        assert Counter(seen["trained"]) == Counter(seen["sampled"]) and len(seen["sampled"]) == 8 * 8
        assert r["rollouts_generated"] == r["rollouts_in_groups"] == 8 * 8 and r["groups_trained"] == 8


def test_cppo_batch_pruning_trains_on_groups_x_m_rollouts(tmp_path, smoke_model_dir, monkeypatch):
    """CPPO keeps the groups x m rollouts of the whole batch with the largest |advantage|: 16 of the
    32 rows are trained per step, taken unevenly from the groups (zero-variance groups, all of
    whose advantages are 0, lose theirs first)."""
    witness = StepWitness(monkeypatch)
    selection = {"rule": "max_abs_advantage", "n": 8, "m": 4, "scope": "batch", "advantage_over": "all"}
    steps = read_lines(run(tmp_path / "cppo", smoke_model_dir, "uniform", 3, selection=selection) / "train_log.jsonl")
    assert len(witness.steps) == len(steps) == 3
    for r, seen in zip(steps, witness.steps):
        assert seen["rollouts"] == r["rollouts_generated"] == 32
        assert seen["trained_rows"] == 16 and r["trained_tokens"] == seen["trained_tokens"]
        assert r["grad_norm"] > 0
    # positive control: the pruning chose across groups, not m per group (which group scope would do)
    assert any(sorted(seen["rows_per_prompt"].values()) != [4, 4, 4, 4] for seen in witness.steps)


@pytest.mark.parametrize("strategy", ["greso", "pilot_commit"])
def test_a_resumed_run_continues_the_strategy_state_exactly(tmp_path, smoke_model_dir, strategy):
    straight = run(tmp_path / "straight", smoke_model_dir, strategy, 6)
    resumed = run(tmp_path / "resumed", smoke_model_dir, strategy, 4)  # ends with a checkpoint at step 4
    run(tmp_path / "resumed", smoke_model_dir, strategy, 6)

    logs = [without_timings(read_lines(d / "train_log.jsonl")) for d in (straight, resumed)]
    assert logs[0] == logs[1]
    state = lambda d, step: torch.load(d / f"checkpoints/step-{step:06d}/rank-0.pt", weights_only=False)["allocation"]
    assert state(resumed, 6) == state(straight, 6)
    assert state(resumed, 3) != state(resumed, 6)  # the state moved on after the resume (not trivially equal)
    start = state(resumed, 4)  # what the resume began from: a filled state, not the initial one
    if strategy == "greso":
        assert any(start["easy_streak"]) and any(start["hard_streak"])
    else:
        assert start["buffer"] and sorted(start["pilots"]) == sorted(p for p, *_ in start["buffer"])
    assert [r["checkpoint"] for r in json.loads((resumed / "run.json").read_text())["resumed"]] == ["step-000004"]
    sha = lambda d: json.loads((d / "checkpoints/step-000006/state.json").read_text())["params_sha256"]
    assert sha(resumed) == sha(straight)


def test_pass_rates_counts_correct_rollouts_per_training_prompt(tmp_path, smoke_model_dir, capsys):
    from pods_bench.cli import main

    config = tmp_path / "train.yaml"
    cfg = tiny_run(
        tmp_path / "unused", model={"name": str(smoke_model_dir)}, task={"name": "arith", "system_prompt": ""}
    )
    config.write_text(json.dumps(cfg))  # JSON is YAML
    out = tmp_path / "rates"
    assert main(["pass-rates", "--config", str(config), "--prompts", "10", "--rollouts", "6", "--out", str(out)]) == 0
    import pandas as pd

    counts = pd.read_csv(out / "pass_rates.csv")
    assert list(counts["prompt"]) == list(range(10)) and counts["correct"].between(0, 6).all()
    assert counts["correct"].sum() > 0  # the warm start solves some
    text = (out / "pass_rates.md").read_text()
    assert text.startswith("10 training prompts, n = 6 rollouts each") and "| all wrong (0 / n)" in text
    assert text == capsys.readouterr().out
    assert main(["pass-rates", "--config", str(config), "--prompts", "0", "--out", str(out)]) == 2


def test_a_step_that_cannot_fill_its_batch_stops_the_run_with_one_line(tmp_path):
    """A randomly initialised model answers (almost) nothing: nearly every group is all wrong, so
    dynamic sampling cannot fill the batch; after max_rounds the run stops, marked stopped, resumable."""
    config = tmp_path / "train.yaml"
    cfg = tiny_run(
        tmp_path / "run", allocation={"strategy": "dynamic_sampling", "dynamic_sampling": {"max_rounds": 2}}
    )
    config.write_text(json.dumps(cfg))
    done = subprocess.run(
        [sys.executable, "-m", "pods_bench", "train", "--config", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert re.fullmatch(
        r"pods-bench: error: allocation\.dynamic_sampling: [0-3] of the 4 groups a step trains on after 2 rounds "
        r"\(every other group was all correct or all wrong\); raise allocation\.dynamic_sampling\.max_rounds "
        r"\(0: no limit\) or set allocation\.dynamic_sampling\.when_short=train",
        line,
    ), line
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "stopped"


def test_a_step_with_no_group_to_train_on_goes_on_with_when_short_train(tmp_path):
    """The untrained tiny model answers nothing right, so Pilot-Commit finds no informative prompt;
    with when_short: train each step trains on nothing, logs it and the run goes on (the progress
    bar once failed on the step's reward mean, None)."""
    settings = tiny_run(
        tmp_path / "run",
        allocation={"strategy": "pilot_commit", "pilot_commit": {"when_short": "train", "max_rounds": 2}},
    )
    train(config_from_dict(settings), progress=True)
    steps = read_lines(tmp_path / "run" / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["groups_trained"] == 0 and r["reward_mean"] is None and r["trained_tokens"] == 0 for r in steps)
    assert all(r["rollouts_generated"] > 0 for r in steps)  # it sampled, and spent the time
