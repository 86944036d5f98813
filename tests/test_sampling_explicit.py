"""Every sampling parameter is pods-bench's: neither engine inherits a value from the model's own
generation_config (transformers 5 fills unset GenerationConfig fields from it; vLLM's "auto"
generation config takes defaults from it). Qwen2.5 ships repetition_penalty 1.05, top_k 20 and
top_p 0.8: a replication would silently sample from another distribution than its config says.

The tiny model here carries loud non-default values; rollouts must equal those of the same weights
with a clean generation_config, and a plain `model.generate` shows that the values do bite."""

from __future__ import annotations

import copy
import importlib.util

import pytest
from transformers import GenerationConfig

from pods_bench.config import config_from_dict
from pods_bench.engines.base import SamplingConfig
from pods_bench.engines.hf import HFEngine
from pods_bench.models import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model
from tests.tiny_runs import tiny_run

POLLUTED = dict(
    repetition_penalty=3.0, no_repeat_ngram_size=2, top_k=2, top_p=0.5, min_p=0.3, typical_p=0.5, temperature=0.3
)
QUESTIONS = ["What is 2+3?", "Ann has 3 pens, buys 4, loses 2. How many?"]
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=24)
SAMPLED = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=24, seed=7)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def clean(tokenizer):
    return build_tiny_model(TinyModelConfig(), tokenizer, seed=0).eval()


@pytest.fixture(scope="module")
def polluted(clean):
    model = copy.deepcopy(clean)
    model.generation_config = GenerationConfig(
        **{**model.generation_config.to_diff_dict(), **POLLUTED, "do_sample": True}
    )
    return model


def test_the_pollution_changes_what_a_plain_generate_samples(clean, polluted, tokenizer, prompts):
    """Control: the checkpoint's values do take effect when generate is left to its defaults."""
    ids = tokenizer(prompts[1], add_special_tokens=False, return_tensors="pt")["input_ids"]
    outputs = []
    for model in (clean, polluted):
        config = GenerationConfig(do_sample=False, max_new_tokens=24, pad_token_id=tokenizer.pad_token_id)
        outputs.append(model.generate(ids, generation_config=config)[0].tolist())
    assert outputs[0] != outputs[1]


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_hf_engine_ignores_the_model_generation_config(clean, polluted, tokenizer, prompts, sampling):
    expected = HFEngine(clean, tokenizer).generate(prompts, 3, sampling).completion_ids
    assert HFEngine(polluted, tokenizer).generate(prompts, 3, sampling).completion_ids == expected
    assert polluted.generation_config.repetition_penalty == POLLUTED["repetition_penalty"]  # restored afterwards


def test_the_hf_engine_applies_the_configured_parameters(clean, tokenizer, prompts):
    """The explicit parameters are the configured ones: a repetition penalty set in the config does change
    greedy rollouts, exactly as the same penalty set through generate."""
    plain = HFEngine(clean, tokenizer).generate(prompts, 1, GREEDY).completion_ids
    penalised = HFEngine(clean, tokenizer).generate(
        prompts, 1, SamplingConfig(**{**GREEDY.__dict__, "repetition_penalty": 3.0})
    )
    assert penalised.completion_ids != plain
    ids = tokenizer(prompts[0], add_special_tokens=False, return_tensors="pt")["input_ids"]
    config = GenerationConfig(
        do_sample=False,
        repetition_penalty=3.0,
        max_new_tokens=24,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=HFEngine(clean, tokenizer).eos_ids,
    )
    reference = clean.generate(ids, generation_config=config)[0, ids.shape[1] :].tolist()
    assert penalised.completion_ids[0][0] == reference[: len(penalised.completion_ids[0][0])]


def test_every_sampling_parameter_is_recorded_in_the_resolved_config(tmp_path):
    cfg = config_from_dict(tiny_run(tmp_path, sampling={"top_k": 50, "repetition_penalty": 1.05}))
    recorded = cfg.to_dict()
    for section in ("sampling", "eval"):
        assert {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"} <= set(recorded[section])
    assert (recorded["sampling"]["top_k"], recorded["sampling"]["repetition_penalty"]) == (50, 1.05)
    assert (recorded["eval"]["top_k"], recorded["eval"]["min_p"], recorded["eval"]["repetition_penalty"]) == (
        0,
        0.0,
        1.0,
    )


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_the_vllm_engine_ignores_the_model_generation_config(clean, polluted, tokenizer, prompts, tmp_path):
    """vLLM on the polluted checkpoint samples greedily what HF samples from the clean model."""
    from pods_bench.engines.vllm import VLLMEngine

    save_model(polluted, tokenizer, tmp_path)
    assert GenerationConfig.from_pretrained(tmp_path).repetition_penalty == POLLUTED["repetition_penalty"]
    engine = VLLMEngine(str(tmp_path), tokenizer, {"max_model_len": 256, "max_num_seqs": 8}, seed=0)
    try:
        assert engine.llm.get_default_sampling_params().repetition_penalty == 1.0
        got = engine.generate(prompts, 1, GREEDY).completion_ids
    finally:
        engine.close()
    assert got == HFEngine(clean, tokenizer).generate(prompts, 1, GREEDY).completion_ids
