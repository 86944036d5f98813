"""The HF `generate` rollout engine on the tiny model: sampling log-probs agree with the trainer's
forward pass, seeding, EOS handling, greedy decoding and weight sync."""

from __future__ import annotations

import copy

import pytest
import torch

from pods_bench.engines.base import SamplingConfig
from pods_bench.engines.hf import HFEngine
from pods_bench.models import EOS, TinyModelConfig, build_char_tokenizer, build_tiny_model
from pods_bench.update import KeptRollout, completion_logprobs, pack

# prompts of different lengths, so that left padding differs between rows of one batch
SMALL = TinyModelConfig(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128)
QUESTIONS = ["Q", "What is 2+3?", "Ann has 3 pens, buys 4, loses 2. How many?"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]


@pytest.fixture()
def model(tokenizer):
    return build_tiny_model(TinyModelConfig(), tokenizer, seed=0)


def forward_logprobs(model, rollouts, temperature: float) -> list[torch.Tensor]:
    """The trainer's log-probs (one forward pass over the packed rows) for every completion."""
    sequences = [
        KeptRollout(p, c, 0.0) for p, group in zip(rollouts.prompt_ids, rollouts.completion_ids) for c in group
    ]
    batch = pack(sequences, model.config.pad_token_id, "cpu")
    with torch.no_grad():
        logp = completion_logprobs(model.eval(), batch, temperature)
    return [logp[i, : len(s.completion_ids)] for i, s in enumerate(sequences)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_match_the_training_forward_pass(model, tokenizer, prompts, temperature):
    # max_batch 4 < 3 prompts x 3 samples: batches mix prompts of different lengths (left padding)
    engine = HFEngine(model, tokenizer, max_batch=4)
    rollouts = engine.generate(prompts, 3, SamplingConfig(temperature=temperature, max_new_tokens=24, seed=3))
    sampled = [torch.tensor(lp) for group in rollouts.logprobs for lp in group]
    trained = forward_logprobs(model, rollouts, temperature)
    assert sum(len(lp) for lp in sampled) > 50
    worst = max(float((a - b).abs().max()) for a, b in zip(sampled, trained))
    assert worst < 1e-4, worst


def test_rows_of_one_prompt_share_its_prefill_and_sample_as_with_their_own(model, tokenizer, prompts, monkeypatch):
    """A batch runs each distinct prompt through the model once and copies its KV cache to the rows
    holding it; the rows then sample exactly as after a prefill of their own."""
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=5)
    engine = HFEngine(model, tokenizer, max_batch=4)  # 3 prompts x 3 rows: (p0 p0 p0 p1) (p1 p1 p2 p2) (p2)
    shapes = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    shared = engine.generate(prompts, 3, sampling)
    hook.remove()
    # passes wider than one token: a row per distinct prompt of each batch; the one-row batch prefills itself
    assert [rows for rows, width in shapes if width > 1] == [2, 2, 1], shapes
    monkeypatch.setattr(HFEngine, "prefill_shared_prompts", lambda self, rows, batch: None)
    own = engine.generate(prompts, 3, sampling)
    assert shared.completion_ids == own.completion_ids
    for a, b in zip(sum(shared.logprobs, []), sum(own.logprobs, [])):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


def test_sampling_is_seeded_and_leaves_the_global_rng_alone(model, tokenizer, prompts):
    engine = HFEngine(model, tokenizer)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=11)
    torch.manual_seed(0)
    a = engine.generate(prompts, 4, sampling)
    after_a = torch.rand(3)
    torch.manual_seed(0)
    b = engine.generate(prompts, 4, sampling)
    after_b = torch.rand(3)
    c = engine.generate(prompts, 4, SamplingConfig(temperature=1.0, max_new_tokens=16, seed=12))
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert c.completion_ids != a.completion_ids
    torch.manual_seed(0)
    assert torch.equal(after_a, torch.rand(3)) and torch.equal(after_b, after_a)  # no draws from the global stream
    assert len(a.completion_ids) == len(prompts) and all(len(g) == 4 for g in a.completion_ids)
    assert a.prompt_ids[0] == tokenizer(prompts[0], add_special_tokens=False)["input_ids"]


def test_chunking_does_not_change_the_shapes(model, tokenizer, prompts):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=5)
    small = HFEngine(model, tokenizer, max_batch=1).generate(prompts, 2, sampling)
    assert [len(g) for g in small.completion_ids] == [2, 2, 2]
    for group, lps in zip(small.completion_ids, small.logprobs):
        for ids, lp in zip(group, lps):
            assert 1 <= len(ids) == len(lp) <= 12


def test_a_trained_completion_stops_at_eos_and_keeps_its_format_tags(tokenizer, prompts):
    """Teach the tiny model one completion, then decode it greedily: the text must keep the
    answer-format tags (special tokens of this tokenizer) and stop at EOS."""
    target = "<think>7</think><answer>7</answer>"
    model = build_tiny_model(SMALL, tokenizer, seed=1)
    prompt_ids = tokenizer(prompts[1], add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(target + EOS, add_special_tokens=False)["input_ids"]
    batch = pack([KeptRollout(prompt_ids, completion_ids, 0.0)], tokenizer.pad_token_id, "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(100):
        loss = -completion_logprobs(model, batch, 1.0).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 0.1

    engine = HFEngine(model, tokenizer)
    greedy = engine.generate([prompts[1]], 3, SamplingConfig(temperature=0.0, max_new_tokens=60, seed=0))
    assert greedy.completion_text[0] == [target] * 3
    assert greedy.completion_ids[0][0] == completion_ids  # ends with the EOS token, nothing after it
    # greedy log-probs are those of the untempered model
    trained = forward_logprobs(model, greedy, 1.0)[0]
    assert torch.allclose(torch.tensor(greedy.logprobs[0][0]), trained, atol=1e-4)


def test_sync_weights(tokenizer, prompts):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=2)
    model = build_tiny_model(SMALL, tokenizer, seed=0)
    engine = HFEngine(model, tokenizer)
    engine.sync_weights(model)  # the trainer's own model object: nothing to do
    assert engine.model is model
    before = engine.generate(prompts, 2, sampling)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    assert engine.generate(prompts, 2, sampling).completion_ids != before.completion_ids

    separate = HFEngine(copy.deepcopy(model), tokenizer)  # e.g. an engine on another device
    trained = build_tiny_model(SMALL, tokenizer, seed=7)
    separate.sync_weights(trained)
    assert all(torch.equal(a, b) for a, b in zip(separate.model.state_dict().values(), trained.state_dict().values()))
    assert (
        separate.generate(prompts, 2, sampling).completion_ids
        == HFEngine(trained, tokenizer).generate(prompts, 2, sampling).completion_ids
    )


def test_unseeded_calls_draw_fresh_samples():
    """Without a seed the engine advances the global RNG, so two calls differ."""
    from pods_bench.engines.base import SamplingConfig
    from pods_bench.engines.hf import HFEngine
    from pods_bench.models import TinyModelConfig, build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    engine = HFEngine(
        build_tiny_model(
            TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64), tok
        ),
        tok,
    )
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12)
    first = engine.generate(["abc"], n=4, sampling=sampling).completion_ids
    second = engine.generate(["abc"], n=4, sampling=sampling).completion_ids
    assert first != second
