"""The FLOPs convention of pods_bench/flops.py on the tiny model, counted by hand."""

from __future__ import annotations

import pytest

from pods_bench.config import config_from_dict
from pods_bench.flops import FlopsCounter
from pods_bench.models import TinyModelConfig, build_char_tokenizer, build_tiny_model

DIMS = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=192)


def counter(**sections) -> tuple[FlopsCounter, int]:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelConfig(**DIMS), tokenizer)
    cfg = config_from_dict({"budget": {"max_steps": 1}, **sections})
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=cfg.lora.r, target_modules=cfg.lora.target_modules))
    return FlopsCounter.of(model, cfg), model.config.vocab_size


# every setting the passes depend on, stated: the counts below follow from these, not from the config's
# defaults (a changed default must not change what a test case means)
PLAIN = {
    "loss": {"beta": 0.0, "reference_forward": False},  # no reference pass
    "lora": {"enabled": False},  # every weight trains
    "model": {"gradient_checkpointing": False},  # no recomputed forward
    "optim": {"updates_per_batch": 1},  # one update per batch
}


def plain(**changes) -> dict:
    """PLAIN with some of its settings changed (or others of its sections added)."""
    assert set(changes) <= set(PLAIN), set(changes) - set(PLAIN)
    return {section: {**values, **changes.get(section, {})} for section, values in PLAIN.items()}


def test_the_weights_are_every_linear_layer_and_the_passes_follow_the_config():
    c, vocab = counter(**plain())
    # per layer q 64x64, k 64x32, v 64x32, o 64x64, gate / up 64x192, down 192x64; the (tied) LM head
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 192
    assert c.weights == 2 * per_layer + vocab * 64
    assert (c.layers, c.attention_width, c.update_passes, c.reference_passes) == (2, 64, 3.0, 0)
    # F(T) = 2 N T + 2 L d T (T + 1)
    assert c.forward(10) == 2 * c.weights * 10 + 2 * 2 * 64 * 10 * 11
    assert c.generation(7, [4, 1]) == c.forward(10) + c.forward(7)  # the last position is not processed
    assert c.update([10, 7]) == 3 * (c.forward(10) + c.forward(7))
    assert c.reference([10]) == 0

    lora, _ = counter(**plain(lora={"enabled": True, "r": 4, "target_modules": ["q_proj"]}))
    assert lora.weights == c.weights + 2 * (64 * 4 + 4 * 64)  # two adapters' A and B
    assert lora.update_passes == 2.0
    assert counter(**plain(model={"gradient_checkpointing": True}))[0].update_passes == 4.0
    assert counter(**plain(optim={"updates_per_batch": 2}))[0].update_passes == pytest.approx(3 * 2 + 1)
    assert counter(**plain(loss={"beta": 0.04}))[0].reference_passes == 1  # the KL term's reference
    assert counter(**plain(loss={"reference_forward": True}))[0].reference_passes == 1  # the paper's 1-GPU pass


def test_reference_and_generation_counts_and_an_explicit_head_dim():
    """Values the convention fixes where the first test's cases coincide: the reference pass is
    F per trained sequence (not 1 / F), a completion longer than its prompt is counted, a config's
    own head_dim sets the attention width (not hidden / heads), and widths stay integers."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    ref, _ = counter(**plain(loss={"beta": 0.04}))
    assert ref.reference([10, 7]) == ref.forward(10) + ref.forward(7)
    assert ref.generation(3, [5]) == ref.forward(7)  # 3 prompt + 5 completion positions, the last not processed
    assert ref.generation(0, [0]) == 0  # nothing to process (F(-1) would be negative)
    assert isinstance(ref.attention_width, int) and ref.attention_width == 64
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,  # not 64 / 4 = 16
    )
    cfg = config_from_dict({"budget": {"max_steps": 1}})
    assert FlopsCounter.of(AutoModelForCausalLM.from_config(config), cfg).attention_width == 4 * 8
    # Qwen2's config (the paper's models) has no head_dim: hidden / heads, as an integer
    qwen = Qwen2Config(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4
    )
    assert not hasattr(qwen, "head_dim")
    width = FlopsCounter.of(AutoModelForCausalLM.from_config(qwen), cfg).attention_width
    assert isinstance(width, int) and width == 64
