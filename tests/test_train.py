"""End-to-end training runs of the tiny model on the arithmetic task: the results contract, resume,
determinism, the time budget and checkpoint schedule, LoRA + KL, and evaluation afterwards."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from pods_bench.cli import main as cli
from pods_bench.config import config_from_dict
from pods_bench.errors import PodsBenchError
from pods_bench.train import train
from tests.tiny_runs import StepWitness, read_lines, tiny_run, without_timings

STEP_FIELDS = (
    "step train_time_s time_gen_s time_reward_s time_select_s time_update_s time_sync_s prompts n m "
    "generated_tokens trained_tokens reward_mean reward_std reward_mean_kept reward_std_kept "
    "frac_reward_zero_std completion_len_mean loss grad_norm lr"
).split()
EVAL_FIELDS = (
    "checkpoint step train_time_s benchmark n_problems repeats answer_acc format_acc both_acc mean_length examples"
).split()


def run(run_dir, overrides=(), **sections):
    return train(config_from_dict(tiny_run(run_dir, **sections), list(overrides)), progress=False)


def test_a_short_run_writes_the_results_contract(tmp_path, monkeypatch):
    witness = StepWitness(monkeypatch)
    run_dir = run(tmp_path / "run", eval={"repeats": 2})

    steps = read_lines(run_dir / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r, seen in zip(steps, witness.steps, strict=True):
        assert set(STEP_FIELDS) <= set(r)
        assert (r["prompts"], r["n"], r["m"]) == (4, 4, 2)
        # the counts the engine and the update saw, not the log's own arithmetic
        assert (seen["rollouts"], seen["trained_rows"]) == (16, 8)
        assert r["generated_tokens"] == seen["generated_tokens"] > 0
        assert r["completion_len_mean"] == pytest.approx(seen["generated_tokens"] / 16)
        assert r["trained_tokens"] == seen["trained_tokens"] > 0
        assert r["rollouts_generated"] == seen["rollouts"]
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["lr"] == 1e-3
        assert 0 <= r["frac_reward_zero_std"] <= 1 and r["kl"] is None
        # the paper's allocation: one round, P x n rollouts, all of them in the batch
        assert (r["allocation"], r["num_gen_batches"], r["groups_sampled"], r["groups_trained"]) == (
            "uniform",
            1,
            4,
            4,
        )
        assert r["rollouts_generated"] == 16
    # the clock adds up the phases of each step and nothing else (no evaluation, no checkpoint I/O)
    clock = 0.0
    for r in steps:
        clock += sum(r[f"time_{p}_s"] for p in ("gen", "reward", "select", "update", "sync"))
        assert r["train_time_s"] == pytest.approx(clock, rel=1e-9)

    info = json.loads((run_dir / "run.json").read_text())
    assert (info["status"], info["stop_reason"], info["step"]) == ("finished", "max_steps", 3)
    assert info["config"]["selection"] == {
        "rule": "max_variance",
        "n": 4,
        "m": 2,
        "groups_per_prompt": 1,
        "filter_uniform_groups": False,
        "scale_advantage_by_std": True,
        "advantage_over": "kept",
        "scope": "group",
    }
    assert info["config"]["allocation"]["strategy"] == "uniform"
    assert {"torch", "transformers", "peft", "accelerate", "math-verify", "pods-bench", "vllm"} <= set(
        info["versions"]
    )
    assert info["versions"]["torch"] == torch.__version__
    assert info["hardware"]["world_size"] == 1 and info["hardware"]["cpu_cores"] >= 1
    assert info["started_at"] <= info["finished_at"] and info["resumed"] == []

    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["step-000000", "step-000003"]  # start and end; no temporary folders left
    state = json.loads((run_dir / "checkpoints/step-000003/state.json").read_text())
    assert (state["step"], state["train_time_s"], state["data_cursor"]) == (3, steps[-1]["train_time_s"], 12)
    start = load_file(run_dir / "checkpoints/step-000000/model/model.safetensors")
    end = load_file(run_dir / "checkpoints/step-000003/model/model.safetensors")
    assert any(not torch.equal(start[k], end[k]) for k in start)

    evals = read_lines(run_dir / "eval.jsonl")
    assert [(e["checkpoint"], e["step"]) for e in evals] == [("step-000000", 0), ("step-000003", 3)]
    assert evals[0]["train_time_s"] == 0.0 and evals[1]["train_time_s"] == state["train_time_s"]
    for e in evals:
        assert set(EVAL_FIELDS) <= set(e)
        assert (e["benchmark"], e["n_problems"], e["repeats"]) == ("arith", 6, 2)
        for metric in ("answer_acc", "format_acc", "both_acc", "mean_length"):
            assert len(e[metric]) == 2
        assert e["answer_acc"] != e["mean_length"] and all(0 <= a <= 1 for a in e["answer_acc"])
        assert len(e["examples"]) == 2 and {"question", "gold", "completion", "correct"} <= set(e["examples"][0])


@pytest.mark.slow
def test_resume_after_a_crash_matches_a_straight_run(tmp_path):
    straight = run(tmp_path / "straight", budget={"max_steps": 6})
    resumed = run(tmp_path / "resumed", budget={"max_steps": 3})
    # what a crash after step 4 and during step 5's checkpoint would leave behind
    (resumed / "checkpoints/.tmp-step-000005").mkdir()
    log = (resumed / "train_log.jsonl").read_text()
    (resumed / "train_log.jsonl").write_text(
        log + log.splitlines()[-1].replace('"step": 3', '"step": 4') + '\n{"step": 5, "tr'
    )
    with open(resumed / "eval.jsonl", "a") as f:
        f.write(json.dumps({"checkpoint": "step-000005", "step": 5, "benchmark": "arith"}) + "\n")
    run(tmp_path / "resumed", budget={"max_steps": 6})

    assert without_timings(read_lines(resumed / "train_log.jsonl")) == without_timings(
        read_lines(straight / "train_log.jsonl")
    )
    sha = lambda d: json.loads((d / "checkpoints/step-000006/state.json").read_text())["params_sha256"]
    assert sha(resumed) == sha(straight)
    evals = read_lines(resumed / "eval.jsonl")
    assert [e["checkpoint"] for e in evals] == ["step-000000", "step-000003", "step-000006"]
    assert without_timings(evals)[-1] == without_timings(read_lines(straight / "eval.jsonl"))[-1]
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["step-000000", "step-000003", "step-000006"]
    info = json.loads((resumed / "run.json").read_text())
    assert info["status"] == "finished" and [r["checkpoint"] for r in info["resumed"]] == ["step-000003"]

    # rerunning a finished run changes nothing
    before = (resumed / "train_log.jsonl").read_text()
    run(tmp_path / "resumed", budget={"max_steps": 6})
    assert (resumed / "train_log.jsonl").read_text() == before


def test_same_config_and_seed_give_the_same_log(tmp_path):
    sections = dict(selection={"rule": "random", "filter_uniform_groups": True}, eval={"inline": False})
    a = read_lines(run(tmp_path / "a", **sections) / "train_log.jsonl")
    b = read_lines(run(tmp_path / "b", **sections) / "train_log.jsonl")
    c = read_lines(run(tmp_path / "c", seed=1, **sections) / "train_log.jsonl")
    assert without_timings(a) == without_timings(b)
    assert without_timings(a) != without_timings(c)
    assert all(r["prompts_kept"] == r["prompts"] * (1 - r["frac_reward_zero_std"]) for r in a)  # DAPO filter


def test_time_budget_checkpoints_and_evaluation_afterwards(tmp_path, capsys):
    run_dir = run(
        tmp_path / "timed",
        budget={"max_steps": None, "max_train_time_s": 2.0, "checkpoint_every_s": 0.4},
        eval={"inline": False},
    )
    steps = read_lines(run_dir / "train_log.jsonl")
    clocks = [r["train_time_s"] for r in steps]
    assert clocks[-1] >= 2.0 and all(c < 2.0 for c in clocks[:-1])
    assert json.loads((run_dir / "run.json").read_text())["stop_reason"] == "max_train_time_s"
    assert not (run_dir / "eval.jsonl").exists()

    states = [json.loads(p.read_text()) for p in sorted((run_dir / "checkpoints").glob("step-*/state.json"))]
    assert (states[0]["step"], states[0]["train_time_s"]) == (0, 0.0)
    assert states[-1]["step"] == len(steps)
    # after step 0: a checkpoint exactly at each step whose clock passed a new multiple of 0.4 s
    expected = [r["step"] for prev, r in zip([0.0] + clocks, steps) if r["train_time_s"] // 0.4 > prev // 0.4]
    assert [s["step"] for s in states[1:]] == sorted(set(expected) | {len(steps)})
    assert all(s["train_time_s"] == clocks[s["step"] - 1] for s in states[1:])

    assert cli(["evaluate", str(run_dir)]) == 0
    evals = read_lines(run_dir / "eval.jsonl")
    assert [(e["step"], e["train_time_s"]) for e in evals] == [(s["step"], s["train_time_s"]) for s in states]
    assert cli(["evaluate", str(run_dir)]) == 0  # nothing left to do
    assert len(read_lines(run_dir / "eval.jsonl")) == len(states)
    assert "0 eval records" in capsys.readouterr().out

    # a second benchmark setting, pruning evaluated checkpoints but the newest
    assert (
        cli(
            [
                "evaluate",
                str(run_dir),
                "--set",
                "eval.benchmarks=gsm8k",
                "--set",
                "eval.keep_checkpoints=last",
                "--set",
                "data_dir=" + str(tmp_path / "no-data"),
            ]
        )
        == 2
    )  # gsm8k is not in that folder
    shutil.copytree(run_dir, tmp_path / "copy")
    assert (
        cli(["evaluate", str(tmp_path / "copy"), "--set", "eval.keep_checkpoints=last", "--set", "eval.n_problems=3"])
        == 0
    )
    assert [p.name for p in (tmp_path / "copy/checkpoints").iterdir()] == [f"step-{states[-1]['step']:06d}"]


def test_lora_with_kl_and_several_updates(tmp_path):
    run_dir = run(
        tmp_path / "lora",
        lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        loss={"beta": 0.05, "aggregation": "token"},
        optim={"lr": 1e-2, "updates_per_batch": 2, "micro_batch_size": 3},
        budget={"max_steps": 2},
        eval={"inline": False},
    )
    steps = read_lines(run_dir / "train_log.jsonl")
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the adapter starts as the identity (B = 0)
    assert all(math.isfinite(r["loss"]) and r["kl"] >= 0 for r in steps)
    adapter = [load_file(run_dir / f"checkpoints/step-00000{s}/model/adapter_model.safetensors") for s in (0, 2)]
    assert not (run_dir / "checkpoints/step-000002/model/model.safetensors").exists()  # the adapter only
    assert all("lora_" in k for k in adapter[0]) and any(
        not torch.equal(adapter[0][k], adapter[1][k]) for k in adapter[0]
    )
    assert cli(["evaluate", str(run_dir)]) == 0  # evaluation loads base model + adapter
    assert [e["checkpoint"] for e in read_lines(run_dir / "eval.jsonl")] == ["step-000000", "step-000002"]


def test_a_run_folder_is_resumed_only_by_the_same_config(tmp_path):
    run_dir = run(tmp_path / "run", budget={"max_steps": 1}, eval={"inline": False})
    before = (run_dir / "run.json").read_text()
    with pytest.raises(PodsBenchError, match=r"another config \(selection.n: 4 there, 8 now\)"):
        run(run_dir, ["selection.n=8"], budget={"max_steps": 2})
    assert (run_dir / "run.json").read_text() == before


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_the_vllm_engine_is_a_config_choice(tmp_path):
    run_dir = run(
        tmp_path / "vllm",
        # vLLM's CPU attention needs head_dim >= 32
        model={
            "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128}
        },
        engine={"name": "vllm", "options": {"max_model_len": 512}},
        budget={"max_steps": 2},
    )
    steps = read_lines(run_dir / "train_log.jsonl")
    assert [r["step"] for r in steps] == [1, 2] and all(
        r["generated_tokens"] > 0 and r["grad_norm"] > 0 for r in steps
    )
    evals = read_lines(run_dir / "eval.jsonl")
    # the engine samples from the updated weights: same seeds, different completions
    assert [e["completion"] for e in evals[0]["examples"]] != [e["completion"] for e in evals[1]["examples"]]


def test_a_run_folder_is_trained_by_one_process_at_a_time(tmp_path, capsys):
    """E.g. training processes left running by a killed launcher, and the job started again."""
    from pods_bench.io import locked

    config = tmp_path / "train.yaml"
    config.write_text(json.dumps(tiny_run(tmp_path / "run", budget={"max_steps": 1}, eval={"inline": False})))
    with locked(tmp_path / "run" / ".train.lock"):  # what a running trainer holds
        assert cli(["train", "--config", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"pods-bench: error: {tmp_path / 'run'} is being trained by another process (it holds .train.lock); stop it first\n"
    )
    assert not (tmp_path / "run" / "run.json").exists()
    assert cli(["train", "--config", str(config), "--no-progress"]) == 0  # the lock died with its holder


def test_two_evaluators_of_a_run_never_duplicate_a_record(tmp_path):
    from pods_bench.evaluate import append_eval_records

    records = [
        {"checkpoint": "step-000000", "step": 0, "benchmark": b, "answer_acc": [0.5]} for b in ("arith", "gsm8k")
    ]
    assert append_eval_records(tmp_path, records[:1]) == 1
    assert append_eval_records(tmp_path, records) == 1  # arith was there already
    assert append_eval_records(tmp_path, records) == 0
    assert read_lines(tmp_path / "eval.jsonl") == records


def test_the_reference_forward_at_beta_0_costs_a_pass_and_changes_nothing(tmp_path, monkeypatch):
    """loss.reference_forward (the paper's single-GPU trainer): every step a reference pass over the
    kept rollouts, whose result is dropped; the log (timings aside) and the weights equal a run
    without it, with LoRA (adapters disabled) and with full fine-tuning (a frozen copy)."""
    import pods_bench.update as update

    rows = []
    real = update.reference_logprobs

    def counted(policy, ref_model, batch, temperature, chunk_tokens):
        rows.append((ref_model is None, batch["input_ids"].shape[0]))
        return real(policy, ref_model, batch, temperature, chunk_tokens)

    monkeypatch.setattr(update, "reference_logprobs", counted)
    sha = lambda d: json.loads((d / "checkpoints/step-000003/state.json").read_text())["params_sha256"]
    for name, lora in (("lora", {"enabled": True, "r": 4, "alpha": 8}), ("full", {"enabled": False})):
        sections = dict(lora=lora, eval={"inline": False})
        plain = run(tmp_path / name / "plain", **sections)
        assert rows == []
        paid = run(tmp_path / name / "paid", loss={"reference_forward": True}, **sections)
        # each step: the 4 prompts x m = 2 kept rollouts, one micro-batch of 8; LoRA disables its adapters
        assert rows == [(name == "lora", 8)] * 3
        logs = [without_timings(read_lines(d / "train_log.jsonl")) for d in (plain, paid)]
        # the pass is counted in the FLOPs, and changes nothing else
        assert all(r["flops_reference"] == 0 for r in logs[0]) and all(r["flops_reference"] > 0 for r in logs[1])
        drop = lambda log: [{k: v for k, v in r.items() if k != "flops_reference"} for r in log]
        assert drop(logs[0]) == drop(logs[1]) and sha(plain) == sha(paid)
        rows.clear()


def test_the_attention_kernel_is_the_configured_one(tmp_path):
    """model.attn_implementation reaches the loaded model; flash_attention_2 without its package is a
    one-line error naming the key."""
    from pods_bench.checkpoint import load_base_model

    cfg = config_from_dict(tiny_run(tmp_path), ["model.attn_implementation=eager"])
    assert load_base_model(cfg)[0].config._attn_implementation == "eager"
    assert load_base_model(config_from_dict(tiny_run(tmp_path)))[0].config._attn_implementation == "sdpa"
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(PodsBenchError, match=r"^config key model\.attn_implementation: FlashAttention2"):
            load_base_model(config_from_dict(tiny_run(tmp_path), ["model.attn_implementation=flash_attention_2"]))
