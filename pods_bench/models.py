"""Tiny causal language models built from a config, with a tokenizer built locally.

Used by the smoke benchmark and the tests: nothing is downloaded. Real experiments load a hub model
by name instead (`load_model_and_tokenizer`).

The tokenizer is character-level (one token per character) plus single-token special markers for
the chat template and the answer format. A character vocabulary keeps a sub-million-parameter model
able to do digit arithmetic (byte-pair merges would glue digits together). Qwen3/Llama
architectures only: transformers' AutoTokenizer silently swaps the tokenizer of `qwen2` folders
for a Qwen2Tokenizer, which drops spaces of a character-level vocabulary.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

from pods_bench.errors import PodsBenchError
from pods_bench.model_sources import resolve

# ChatML, as used by Qwen models: the smoke model sees prompts in the same form as real ones.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PAD, EOS, BOS = "<|endoftext|>", "<|im_end|>", "<|im_start|>"
SPECIAL_TOKENS = [PAD, EOS, BOS, "<think>", "</think>", "<answer>", "</answer>", "[UNK]"]
CHARACTERS = string.ascii_letters + string.digits + string.punctuation + " \n"


def build_char_tokenizer():
    """A character-level fast tokenizer with ChatML specials and the answer-format tags."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join without separators
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token="[UNK]",
        chat_template=CHATML_TEMPLATE,
        padding_side="left",  # decoder-only generation pads on the left
    )


@dataclass(frozen=True)
class TinyModelConfig:
    architecture: str = "llama"  # "llama" or "qwen3"
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 512


def build_tiny_model(cfg: TinyModelConfig, tokenizer, seed: int = 0):
    """A randomly initialised causal LM from `cfg`, sized to the tokenizer's vocabulary."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        GenerationConfig,
        LlamaConfig,
        Qwen3Config,
    )

    config_classes = {"llama": LlamaConfig, "qwen3": Qwen3Config}
    if cfg.architecture not in config_classes:
        raise PodsBenchError(f"tiny model architecture {cfg.architecture!r} is not one of {sorted(config_classes)}")
    hf_config = config_classes[cfg.architecture](
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config)
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def save_model(model, tokenizer, folder: str | Path) -> None:
    """Save weights + tokenizer as a standard Hugging Face folder (loadable by vLLM too)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def load_model_and_tokenizer(name_or_path: str, dtype: str = "float32", device: str | None = None, meta: bool = False):
    """Load a hub model by name (GPU runs), a local folder (the smoke model) or a GGUF file
    (pods_bench/model_sources.py: `gguf:<file>`, `package:<package>/<file>`). `meta`: the same
    model on the meta device (its config and generation config, no weights read or allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    name_or_path = resolve(name_or_path).path  # a GGUF file: its converted folder
    path = Path(name_or_path)
    if name_or_path.startswith((".", "/")) and not path.exists():
        raise PodsBenchError(f"model folder {name_or_path} does not exist")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        if meta:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(
                    AutoConfig.from_pretrained(name_or_path), dtype=getattr(torch, dtype)
                )
            model.eval()  # as from_pretrained leaves it
            try:  # as from_pretrained reads it (special tokens: Qwen2.5 ends on two EOS ids)
                model.generation_config = GenerationConfig.from_pretrained(name_or_path)
            except OSError:
                pass  # none saved: the one derived from the config, as from_pretrained keeps
        else:
            model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    except OSError as e:
        raise PodsBenchError(f"cannot load model {name_or_path!r}: {str(e).splitlines()[0]}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if device:
        model.to(device)
    return model, tokenizer


# --- random models at a real model's size (the GPU check) --------------------------------------------


class TokenIdTokenizer:
    """Just enough of a tokenizer for HFEngine on token-id prompts (a prompt's 'text' is its ids
    joined by spaces): nothing is downloaded, and the prompt length is exact.

    Padding is id 0; EOS is `vocab`, one past the last id the model's head can produce, so a random
    model's rows never stop early (were EOS a real id, every sampled occurrence would end a row)."""

    pad_token_id = 0

    def __init__(self, vocab: int):
        self.eos_token_id = vocab

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(t) for t in text.split()]}

    def pad(self, batch, padding=True, padding_side="left", return_tensors="pt"):
        import torch

        rows = batch["input_ids"]
        width = max(map(len, rows))
        ids = [[self.pad_token_id] * (width - len(r)) + r for r in rows]
        mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def build_random_model(dims, dtype: str, device: str):
    """A randomly initialised Qwen2-architecture causal LM with the dimensions `dims`
    (pods_bench.planning.architecture.ModelDims), built directly on `device` in `dtype`, with its
    EOS outside the sampled range (TokenIdTokenizer), so that it decodes to the length limit."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    hf = Qwen2Config(
        vocab_size=dims.vocab,
        hidden_size=dims.hidden,
        num_hidden_layers=dims.layers,
        num_attention_heads=dims.heads,
        num_key_value_heads=dims.kv_heads,
        intermediate_size=dims.intermediate,
        tie_word_embeddings=dims.tied,
        max_position_embeddings=4096,
        pad_token_id=TokenIdTokenizer.pad_token_id,
        eos_token_id=None,  # the engine takes TokenIdTokenizer's, which the config may not name
    )
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = TokenIdTokenizer.pad_token_id
    return model
