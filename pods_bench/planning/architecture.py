"""The dimensions of a config's model, and the parameter counts that follow from them.

Read without loading weights: the tiny model from its config section, a local folder from its
config.json, a hub model from config/models.yaml (the paper's models, so that planning works
offline) or else from the hub's config.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from pods_bench.errors import PodsBenchError
from pods_bench.model_sources import is_gguf, resolve
from pods_bench.models import CHARACTERS, SPECIAL_TOKENS
from pods_bench.pretrain import PretrainConfig

KNOWN_MODELS_FILE = Path(__file__).resolve().parents[2] / "config" / "models.yaml"
# Llama / Qwen decoder blocks: the linear layers LoRA can target, as (fan_in, fan_out) of ModelDims
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelDims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True
    qkv_bias: bool = False
    head_dim_given: int | None = None  # config.json's head_dim where it is not hidden / heads (Qwen3: 128)
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's q and k

    @property
    def head_dim(self) -> int:
        return self.head_dim_given or self.hidden // self.heads

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the k (and of the v) projection's output: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def projection_shape(self, name: str) -> tuple[int, int]:
        h, q, kv, f = self.hidden, self.q_width, self.kv_width, self.intermediate
        shapes = {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, f),
            "up_proj": (h, f),
            "down_proj": (f, h),
        }
        if name not in shapes:
            raise PodsBenchError(
                f"config key lora.target_modules: unknown module {name!r}; planning knows {', '.join(PROJECTIONS)}"
            )
        return shapes[name]

    @property
    def layer_params(self) -> int:
        """One decoder block: 7 projections, their biases where the family has them, 2 RMSNorms
        (+ Qwen3's q and k norms)."""
        weights = sum(a * b for a, b in map(self.projection_shape, PROJECTIONS))
        bias = (self.q_width + 2 * self.kv_width) if self.qkv_bias else 0
        return weights + bias + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def params(self) -> int:
        """All parameters: embeddings (and an untied LM head), the blocks and the final norm."""
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * self.layer_params + self.hidden

    def lora_params(self, rank: int, target_modules) -> int:
        """Trainable parameters of LoRA: A (fan_in x r) and B (r x fan_out) per targeted projection."""
        return self.layers * sum(rank * (a + b) for a, b in map(self.projection_shape, target_modules))


def _from_hf_config(c: dict) -> ModelDims:
    return ModelDims(
        hidden=c["hidden_size"],
        layers=c["num_hidden_layers"],
        heads=c["num_attention_heads"],
        kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
        intermediate=c["intermediate_size"],
        vocab=c["vocab_size"],
        tied=bool(c.get("tie_word_embeddings", False)),
        qkv_bias=bool(c.get("attention_bias", c.get("model_type") == "qwen2")),
        head_dim_given=c.get("head_dim"),
        qk_norm=c.get("model_type") == "qwen3",
    )


def known_models(path: str | Path = KNOWN_MODELS_FILE) -> dict[str, ModelDims]:
    return {name: ModelDims(**dims) for name, dims in yaml.safe_load(Path(path).read_text(encoding="utf-8")).items()}


def model_dims(model_cfg) -> ModelDims:
    """The dimensions of `model_cfg` (the trainer config's `model` section)."""
    if model_cfg.name == "tiny":
        t = model_cfg.tiny
        qwen3 = t.architecture == "qwen3"
        return ModelDims(
            t.hidden_size,
            t.num_layers,
            t.num_heads,
            t.num_kv_heads,
            t.intermediate_size,
            len(SPECIAL_TOKENS) + len(CHARACTERS),
            head_dim_given=128 if qwen3 else None,  # transformers' Qwen3Config default (build_tiny_model sets none)
            qk_norm=qwen3,
        )
    if is_gguf(model_cfg.name):  # its converted folder (converted now if it was not yet)
        model_cfg = type(model_cfg)(name=resolve(model_cfg.name).path)
    folder = Path(model_cfg.name) / "config.json"
    if folder.is_file():
        return _from_hf_config(json.loads(folder.read_text(encoding="utf-8")))
    if Path(model_cfg.name).parent == Path("results/warm_start"):  # the workflow builds it: its recipe's model
        return model_dims(type(model_cfg)(name="tiny", tiny=PretrainConfig().model))
    known = known_models()
    if model_cfg.name in known:
        return known[model_cfg.name]
    try:
        from transformers import AutoConfig

        return _from_hf_config(AutoConfig.from_pretrained(model_cfg.name).to_dict())
    except (OSError, KeyError, ValueError) as e:
        raise PodsBenchError(
            f"model {model_cfg.name!r}: no local config.json, not in {KNOWN_MODELS_FILE.name}, and the hub "
            f"gave none ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        ) from None
