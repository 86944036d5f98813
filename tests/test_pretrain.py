"""The warm start of the smoke model: a loadable folder, the settings cache, completion-only loss,
randomised answers, bad input, and a short real pretrain that clearly learns the task."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest

from pods_bench.errors import PodsBenchError
from pods_bench.models import TinyModelConfig, build_char_tokenizer, load_model_and_tokenizer
from pods_bench.pretrain import (
    PretrainConfig,
    make_batch,
    pretrain,
    randomise_answers,
    read_meta,
    render_prompt,
    train_warm_start,
    training_problems,
)
from pods_bench.tasks import get_task

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
QUICK = PretrainConfig(model=TINY, steps=10, batch_size=8, warmup_steps=2)


def test_pretrain_writes_a_loadable_folder_and_reuses_it(tmp_path):
    out = tmp_path / "warm"
    assert pretrain(QUICK, out, show_progress=False) == (out, False)
    meta = read_meta(out)
    assert (meta["steps"], meta["clean_steps"], meta["noise_steps"]) == (10, 9, 1)  # last 15 % of the steps
    assert meta["settings"]["model"]["hidden_size"] == 32 and len(meta["settings_hash"]) == 16
    model, tokenizer = load_model_and_tokenizer(str(out))
    assert model.config.model_type == "llama" and sum(p.numel() for p in model.parameters()) == meta["parameters"]
    assert tokenizer.decode(tokenizer("Ann has 3 pens<answer>")["input_ids"]) == "Ann has 3 pens<answer>"
    assert [p.name for p in tmp_path.iterdir()] == ["warm"]  # no temporary folder left behind

    weights = out / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert pretrain(QUICK, out, show_progress=False) == (out, True)  # same settings: reused at once
    assert weights.stat().st_mtime_ns == stamp

    assert pretrain(replace(QUICK, seed=1), out, show_progress=False) == (out, False)  # changed: rebuilt
    assert read_meta(out)["settings"]["seed"] == 1 and read_meta(out)["settings_hash"] != meta["settings_hash"]
    assert weights.stat().st_mtime_ns != stamp and [p.name for p in tmp_path.iterdir()] == ["warm"]


def test_the_recipe_sets_its_own_torch_threads():
    """The weights depend on the thread count (the order of float sums), so pretraining uses the
    recipe's threads, not the process's, records them, and gives the process its own back."""
    import torch

    cfg = replace(QUICK, threads=1)
    before = torch.get_num_threads()
    weights = []
    try:
        for ambient in (1, 2):
            torch.set_num_threads(ambient)
            model, _, stats = train_warm_start(cfg, training_problems(cfg), show_progress=False)
            assert stats["torch_threads"] == 1 and torch.get_num_threads() == ambient
            weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(weights[0], weights[1])
    assert PretrainConfig().threads == 2  # the 2-core smoke machine's (docs/smoke-model.md)


def test_seconds_cap_stops_training_early():
    cfg = replace(QUICK, steps=10**6, seconds=2.0)
    _, _, stats = train_warm_start(cfg, training_problems(cfg), show_progress=False)
    assert 1 <= stats["steps"] < 10**6 and stats["wall_s"] < 60


def test_loss_covers_completion_tokens_only():
    tokenizer = build_char_tokenizer()
    problems = get_task("arith").load("train")[:2]
    prompt_ids = tokenizer([render_prompt(QUICK, p, tokenizer) for p in problems], add_special_tokens=False)[
        "input_ids"
    ]
    input_ids, mask, labels = make_batch(prompt_ids, [p.solution for p in problems], tokenizer)
    for row, (p, ids) in enumerate(zip(problems, prompt_ids)):
        n = int(mask[row].sum())
        completion = labels[row, len(ids) : n].tolist()
        assert labels[row, : len(ids)].eq(-100).all() and labels[row, n:].eq(-100).all()
        assert input_ids[row, : len(ids)].tolist() == ids and completion == input_ids[row, len(ids) : n].tolist()
        assert tokenizer.decode(completion) == p.solution + tokenizer.eos_token


def test_randomised_answers_keep_the_worked_computation():
    solution, golds = "<think>3+4=7;7-2=5</think><answer>5</answer>", [str(k) for k in range(100, 200)]
    out = randomise_answers([solution] * 2000, golds, 0.5, random.Random(0))
    changed = [c for c in out if c != solution]
    assert 850 <= len(changed) <= 1150
    assert all(c.startswith("<think>3+4=7;7-2=5</think><answer>1") and c.endswith("</answer>") for c in changed)
    assert randomise_answers([solution] * 10, golds, 0.0, random.Random(0)) == [solution] * 10


@pytest.mark.parametrize(
    "change, message",
    [
        ({"steps": 0}, "steps must be >= 1"),
        ({"seconds": 0.0}, "seconds must be > 0"),
        ({"seconds": -5.0}, "seconds must be > 0"),
        ({"noise_share": 1.0}, "noise_share must be in"),
        ({"noise_fraction": 1.5}, "noise_fraction must be in"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"threads": 0}, "threads must be >= 1"),
        ({"task": "nope"}, "unknown task 'nope'"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, change, message):
    with pytest.raises(PodsBenchError, match=message):
        pretrain(replace(QUICK, **change), tmp_path / "warm", show_progress=False)
    assert not (tmp_path / "warm").exists()


def test_refuses_to_overwrite_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(PodsBenchError, match="not a pretrained-model folder"):
        pretrain(QUICK, tmp_path, show_progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "args, message", [(["--seconds", "0"], "seconds must be > 0"), (["--steps", "-3"], "steps must be >= 1")]
)
def test_cli_bad_budget(tmp_path, args, message):
    out = subprocess.run(
        [sys.executable, "-m", "pods_bench", "pretrain", "--out", str(tmp_path / "warm"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = out.stderr.strip().splitlines()
    assert (
        out.returncode == 2 and len(lines) == 1 and lines[0].startswith("pods-bench: error: ") and message in lines[0]
    )
    assert not (tmp_path / "warm").exists()


def test_warm_start_clearly_learns_the_task(smoke_model_dir):
    """Sampled at temperature 1 and graded by math-verify, the short warm start answers several
    times more problems correctly than a model that learned only the format and guesses answers from
    the gold distribution (it would score sum_g p(g)^2, ~4 %); an untrained model scores 0."""
    from pods_bench.config import EvalConfig
    from pods_bench.engines.hf import HFEngine
    from pods_bench.evaluate import Benchmark, evaluate_benchmark
    from pods_bench.rewards import RewardConfig, RewardFunction

    model, tokenizer = load_model_and_tokenizer(str(smoke_model_dir))
    settings = read_meta(smoke_model_dir)["settings"]
    cfg = PretrainConfig(prompt_style=settings["prompt_style"], system_prompt=settings["system_prompt"])
    problems = get_task("arith").load("test")[:300]
    benchmark = Benchmark("arith", problems, [render_prompt(cfg, p, tokenizer) for p in problems])
    eval_cfg = EvalConfig(benchmarks=["arith"], temperature=1.0, max_new_tokens=32, seed=0)
    with RewardFunction(RewardConfig(workers=0)) as reward:
        result = evaluate_benchmark(HFEngine(model, tokenizer), benchmark, eval_cfg, reward)
    golds = Counter(p.gold for p in problems)
    guessing = sum((k / len(problems)) ** 2 for k in golds.values())
    assert result["format_acc"][0] >= 0.9
    assert result["answer_acc"][0] >= 3 * guessing, (result["answer_acc"], guessing)
