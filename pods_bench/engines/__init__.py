"""Rollout engines by name: the trainer calls `make_engine(cfg, model, tokenizer)` and never learns
which one it talks to; the engine's factory gets an `EngineSetup` (engine section, the model's name
and precision, the seed), not the config.

  hf    transformers `generate` on the trainer's own model object (pods_bench.engines.hf)
  vllm  a colocated in-process vLLM engine, weights pushed after every update (pods_bench.engines.vllm)

Each engine's module registers its factory in `ENGINES` (engines/base.py), with the dataclass of
its options if it has any. The built-in modules load on first use (`load_engines`): they import
torch, and this package must stay light for the config's check, which looks the engines up here;
vllm.py imports vLLM itself only when an engine starts.
"""

from __future__ import annotations

from pods_bench.engines.base import ENGINES, EngineSetup, RolloutEngine, Rollouts, SamplingConfig
from pods_bench.plugins import Registry

__all__ = [
    "ENGINES",
    "EngineSetup",
    "engine_setup",
    "load_engines",
    "make_engine",
    "RolloutEngine",
    "Rollouts",
    "SamplingConfig",
]


def load_engines() -> Registry:
    """ENGINES with the built-in engines registered (importing an engine's module registers it)."""
    from pods_bench.engines import hf, vllm  # noqa: F401

    return ENGINES


def engine_setup(cfg) -> EngineSetup:
    """What an engine's factory gets of the run's config `cfg`."""
    return EngineSetup(cfg.engine.max_batch, cfg.engine.options, cfg.model.name, cfg.model.mixed_precision, cfg.seed)


def make_engine(cfg, model, tokenizer) -> RolloutEngine:
    """The rollout engine named by `cfg.engine.name`, sampling from `model`."""
    engines = load_engines()
    engines.check(cfg.engine.name)
    return engines[cfg.engine.name](engine_setup(cfg), model, tokenizer)
