"""`make gpu-check` (`pods-bench gpu-check --out DIR`): what pods-bench does on this machine's GPU,
measured in one short run (under 8 minutes on an H200) and compared with `pods-bench plan`'s predictions.

    1. the CUDA tests (tests/test_cuda.py, marker `cuda`), in a subprocess that needs pytest only
    2. the smoke model trained with GRPO and PODS for a few dozen steps (bf16 autocast, HF engine),
       in a fresh DIR/smoke each time (a rerun does not resume the last check's finished runs)
    3. at the paper's scale: a randomly initialised model with Qwen2.5-3B's dimensions (built from
       config/models.yaml, nothing downloaded), 512 prompt + 512 completion tokens, GRPO 16/16 and
       PODS 64/16, LoRA and full fine-tuning (fp32 master weights, bf16 autocast): a short warm-up
       generation and an update, then a timed generation and a timed second update (the first one
       allocates AdamW's state), with the allocator's resting memory and the peak of each phase,
       beside the plan's memory and step time. A row the plan says cannot fit on this device is
       skipped; one that runs out of memory is recorded as such and the check goes on.
    4. the 8-GPU recipe on one GPU (config/h100x8.yaml): Qwen2.5-3B's dimensions sharded with FSDP2
       (pods_bench.sharding.shard: fp32 shards, bf16 compute) in a process group of one (NCCL on a
       GPU, gloo on CPU), at one process's shapes of the 8: its 512 generated rows in one HF generate
       call, the update of its trained rows in micro-batches of 32 (gradient checkpointing), the
       optimizer step; allocated and reserved peaks of each phase beside the plan per device of 8
       and the same plan with its shards made whole (world size 1).
    5. one HF generate call at config/a100x8.yaml's recipe: Qwen2.5-7B's dimensions in bf16 (the
       weights FSDP gathers for generation), engine.max_batch rows of 512 prompt tokens, fewer new
       tokens than the recipe's 1024 (the plan is compared at the lengths measured, and given at
       the recipe's).

Capacity is what the device reports (a MIG slice, a 40 GB A100, a PCIe or NVL card), the speeds the
datasheet entry of config/hardware.yaml whose name matches. DIR/gpu_check.json and gpu_check.md
are rewritten after every part and row, so an aborted check leaves what it measured ("complete":
false). The exit status is 1 when the CUDA tests failed, timed out or did not run on a GPU.

Without a GPU (or with --device cpu) the same steps run with tiny shapes, so that CI checks the
script itself (tests/test_gpu_check.py). No network, no vLLM, no `datasets` (the smoke task is
synthetic); the smoke training grades with math-verify as every run does. On a machine without the
project's venv, scripts/gpu-check-offline.sh runs it with that machine's own Python
(docs/cost-model.md#the-gpu-check-make-gpu-check).
"""

from __future__ import annotations

import gc
import importlib.util
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from pods_bench import run_info
from pods_bench import update as U
from pods_bench.config import config_from_dict
from pods_bench.cuda_memory import configure_allocator
from pods_bench.engines import engine_setup
from pods_bench.engines.hf import HFEngine, start_hf_engine
from pods_bench.errors import PodsBenchError
from pods_bench.experiment import Experiment, hardware_setup, resolve_runs
from pods_bench.io import atomic_write_json, atomic_write_text, read_jsonl
from pods_bench.models import TokenIdTokenizer, build_random_model
from pods_bench.planning.architecture import known_models
from pods_bench.planning.memory import Lengths, memory_estimate, sequences_per_process, trained_per_process
from pods_bench.planning.step_time import StepLengths, from_hardware, predict
from pods_bench.run_dir import TRAIN_LOG, phase_field
from pods_bench.sharding import gathered, shard
from pods_bench.train import train

ROOT = Path(__file__).resolve().parents[1]
QWEN_3B = "Qwen/Qwen2.5-3B-Instruct"
MIB = 2**20
GIB = 2**30
# config/hardware.yaml setups whose datasheet speeds a GPU of that name has (its memory is measured)
DATASHEETS = (("H200", "h200"), ("H100", "h100x8"), ("A100", "a100x8"), ("L40S", "l40s"))
# The fine-tuning modes measured at the paper's scale, one process each; sharded full fine-tuning
# is part 4, at the 8-GPU recipe's shapes (SHARDED_RECIPE)
MODES = ("lora", "full")
# The whole check must end within 8 minutes on an H200 (docs/cost-model.md has the estimate per
# part); the CUDA tests take under a minute there, so a hang is cut off well before that.
CUDA_TESTS_TIMEOUT_S = 180
# Part 4: full fine-tuning sharded with FSDP over 8 processes; part 5: the same recipe's generate
# call at 7B (its update needs the 8 GPUs' shards: 7.6B x 16 bytes of fp32 weights, gradients and
# AdamW state do not fit one GPU's memory).
SHARDED_RECIPE = "config/h100x8.yaml"
GENERATE_RECIPE = "config/a100x8.yaml"


def shapes(device: str) -> dict:
    """The paper's scale on a GPU; a tiny stand-in on CPU. `sharded` and `generate` (parts 4 and 5)
    take their rows, micro-batches and prompt length from the recipe; `completion` None is the
    recipe's sampling.max_new_tokens. A warm-up generation decodes `warmup_tokens` only: it selects
    the kernels (and runs the prefill) at the timed call's batch, not its length."""
    if device == "cuda":
        smoke = {"steps": 20, "prompts": 8, "arms": [(16, 16), (16, 4)], "new_tokens": 32}
        sharded = {"prompt": None, "completion": None, "warmup_tokens": 16}
        generate = {"prompt": None, "completion": 256, "warmup_tokens": 16}
        return {
            "prompt": 512,
            "completion": 512,
            "arms": [(16, 16), (64, 16)],
            "micro": 4,
            "warmup_tokens": 16,
            "smoke": smoke,
            "sharded": sharded,
            "generate": generate,
        }
    smoke = {"steps": 2, "prompts": 4, "arms": [(8, 8), (8, 2)], "new_tokens": 16}
    sharded = {"prompt": 16, "completion": 16, "warmup_tokens": 4}
    generate = {"prompt": 16, "completion": 8, "warmup_tokens": 4}
    return {
        "prompt": 16,
        "completion": 16,
        "arms": [(4, 4), (8, 4)],
        "micro": 4,
        "warmup_tokens": 4,
        "smoke": smoke,
        "sharded": sharded,
        "generate": generate,
    }


def tiny(dims):
    """A real model's architecture at a size a CPU runs in moments (the same code paths)."""
    return replace(dims, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=1000)


def hardware_for_gpu(name: str, total_bytes: int) -> tuple[str, dict]:
    """One process on this GPU: the datasheet speeds of the config/hardware.yaml setup whose
    accelerator has this name (an H100's when none does), and the memory the device reports. A MIG
    slice, a 40 GB A100 or a PCIe/NVL variant has other memory than the datasheet's card; a MIG
    slice also has only part of its speed, which the label says."""
    setup = next((setup for key, setup in DATASHEETS if key in name), None)
    base = hardware_setup(setup or "h100x8")
    label = f"{name}, {total_bytes / 2**30:.1f} GiB, {setup or 'h100x8'} datasheet speeds"
    if "MIG" in name:
        label += " (of the whole GPU: a MIG slice has a share of them)"
    return label, {**base, "processes": 1, "accelerator": {**base["accelerator"], "memory_gib": total_bytes / 2**30}}


def hardware_for(device: str) -> tuple[str, dict]:
    import torch

    if device != "cuda":
        return "cpu", hardware_setup("cpu")
    _, total = torch.cuda.mem_get_info(0)  # what this device (or MIG slice) has, not the datasheet's
    return hardware_for_gpu(torch.cuda.get_device_name(0), total)


class DeviceMemory:
    """The CUDA allocator's counters in MiB; None on CPU (tests/test_planning.py measures there)."""

    def __init__(self, device: str):
        import torch

        self.cuda = torch.cuda if device == "cuda" else None

    def sync(self) -> None:
        if self.cuda:
            self.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            self.cuda.reset_peak_memory_stats()

    def allocated(self) -> int | None:
        """What live tensors hold now (not a high-water mark)."""
        return round(self.cuda.memory_allocated() / MIB) if self.cuda else None

    def peak(self) -> int | None:
        """The most live tensors held since the last reset_peak."""
        return round(self.cuda.max_memory_allocated() / MIB) if self.cuda else None

    def reserved(self) -> int | None:
        """What the caching allocator holds from the device now (live tensors, cached blocks)."""
        return round(self.cuda.memory_reserved() / MIB) if self.cuda else None

    def peak_reserved(self) -> int | None:
        """The most the allocator held since the last reset_peak: what the device had to give."""
        return round(self.cuda.max_memory_reserved() / MIB) if self.cuda else None

    def release(self) -> None:
        """Give cached blocks back, so that the next row starts from what it allocates itself."""
        gc.collect()
        if self.cuda:
            self.cuda.empty_cache()


# --- 1. the CUDA tests -------------------------------------------------------------------------------


def run_pytest(paths: list[Path], junit: Path, timeout_s: float = CUDA_TESTS_TIMEOUT_S) -> dict:
    """The `cuda`-marked tests of `paths` in a pytest subprocess; passed only if some ran and every one
    passed (a test skipped on a GPU machine did not check anything).

    Needs pytest alone: the project's addopts (pytest-benchmark's options) are cleared, that plugin
    is kept out whether installed or not, and conftest.py (which needs psutil) is not loaded; the
    offline settings it makes are set here instead."""
    if importlib.util.find_spec("pytest") is None:
        return {"ran": False, "passed": False, "why": "pytest is not installed (pip install pytest)"}
    command = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "-p", "no:benchmark"]
    command += ["-o", "addopts=", "--noconftest", "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml")]
    command += [f"--junitxml={junit}", *map(str, paths)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    junit.unlink(missing_ok=True)
    # its own process group, so that a timeout also ends what the tests started (grading pools)
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as process:
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            return {"ran": True, "passed": False, "why": f"timed out after {timeout_s:g} s", "output": output[-2000:]}
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {key: int(suite.get(key, 0)) for key in counts}
    passed = process.returncode == 0 and counts["tests"] > 0 and counts["skipped"] == 0
    summary = (output.strip().splitlines() or [""])[-1]
    result = {"ran": True, "passed": passed, "returncode": process.returncode, **counts, "summary": summary}
    if not passed:
        result["output"] = output[-2000:]
    return result


def cuda_tests(device: str, out: Path) -> dict:
    if device != "cuda":
        return {"ran": False, "passed": None, "why": "no GPU: tests/test_cuda.py skips itself"}
    return run_pytest([ROOT / "tests" / "test_cuda.py"], out / "cuda_tests.xml")


# --- 2. the smoke model ------------------------------------------------------------------------------


def smoke_training(device: str, out: Path, smoke: dict) -> Iterator[dict]:
    """GRPO n/n and PODS n/m (max-variance) on the arith task, the tiny model from scratch, in a
    fresh `out`/smoke: a finished run there would be resumed (no steps, the old timings)."""
    shutil.rmtree(out / "smoke", ignore_errors=True)
    for n, m in smoke["arms"]:
        arm = f"{'grpo' if n == m else 'pods'}_n{n}_m{m}"
        cfg = config_from_dict(
            {
                "experiment": "gpu-check",
                "arm": arm,
                "device": device,
                "output_dir": str(out / "smoke" / arm),
                "model": {"name": "tiny", "mixed_precision": "bf16" if device == "cuda" else "no"},
                "task": {"name": "arith", "system_prompt": ""},
                "engine": {"name": "hf"},
                "prompts_per_step": smoke["prompts"],
                "selection": {"rule": "all" if n == m else "max_variance", "n": n, "m": m},
                "sampling": {"temperature": 1.0, "max_new_tokens": smoke["new_tokens"]},
                "optim": {"lr": 1e-4, "micro_batch_size": 128},
                "reward": {"workers": 1},
                "budget": {"max_steps": smoke["steps"], "checkpoint_every_s": 1e9},
                "eval": {"inline": False, "benchmarks": ["arith"]},
            }
        )
        train(cfg, progress=False)
        log = read_jsonl(out / "smoke" / arm / TRAIN_LOG)
        mean = lambda key: sum(r[key] for r in log) / len(log)
        yield {
            "arm": arm,
            "steps": len(log),
            "s_per_step": round(log[-1]["train_time_s"] / len(log), 4),
            **{f"{p}_s": round(mean(phase_field(p)), 4) for p in ("gen", "reward", "update", "sync")},
            "reward_first": round(log[0]["reward_mean"], 3),
            "reward_last": round(log[-1]["reward_mean"], 3),
        }


# --- 3. the paper's scale ----------------------------------------------------------------------------


def paper_config(device: str, mode: str, n: int, m: int, s: dict):
    lora = mode == "lora"
    model = {"name": QWEN_3B, "mixed_precision": "bf16" if device == "cuda" else "no", "gradient_checkpointing": True}
    model["dtype"] = "bfloat16" if lora and device == "cuda" else "float32"
    return config_from_dict(
        {
            "device": device,
            "prompts_per_step": 1,
            "model": model,
            "lora": {
                "enabled": lora,
                "r": 64,
                "alpha": 64,
                "dropout": 0.0,
                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            },
            "selection": {"rule": "all" if n == m else "max_variance", "n": n, "m": m},
            "task": {"max_prompt_tokens": s["prompt"]},
            "sampling": {"temperature": 0.9, "max_new_tokens": s["completion"]},
            "optim": {"lr": 5e-6, "micro_batch_size": s["micro"]},
            "budget": {"max_steps": 1},
        }
    )


def local(t):
    """A tensor's part on this process (a sharded DTensor's local shard)."""
    return t.to_local() if hasattr(t, "to_local") else t


def tensor_mib(tensors) -> float:
    return sum(local(t).numel() * local(t).element_size() for t in tensors) / MIB


def optimizer_state_mib(optimizer) -> float:
    import torch

    return tensor_mib(t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))


def random_prompt(vocab: int, tokens: int) -> str:
    """`tokens` random ids as TokenIdTokenizer text: the same prompt every time."""
    import torch

    g = torch.Generator().manual_seed(0)
    return " ".join(map(str, torch.randint(1, vocab, (tokens,), generator=g).tolist()))


def measure_step(cfg, dims, device: str, s: dict) -> dict:
    """A warm-up generation of n rollouts (s["warmup_tokens"] new tokens) and an update on m of
    them (kernel selection, allocator growth, AdamW's state), then a generation to the length limit
    and the update, timed: seconds and allocator peaks of each phase."""
    import torch
    from accelerate import Accelerator
    from transformers import get_scheduler

    memory = DeviceMemory(device)
    policy = build_random_model(dims, cfg.model.dtype, device)
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(
            policy,
            LoraConfig(
                r=cfg.lora.r,
                lora_alpha=cfg.lora.alpha,
                lora_dropout=0.0,
                target_modules=list(cfg.lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )
    policy.gradient_checkpointing_enable()
    if cfg.lora.enabled:
        policy.enable_input_require_grads()
    accelerator = Accelerator(cpu=device != "cuda", mixed_precision=cfg.model.mixed_precision)
    model = accelerator.prepare(policy)
    optimizer = U.make_optimizer(model, cfg, 1)
    learner = U.Learner(
        model, accelerator.unwrap_model(model), None, optimizer, get_scheduler("constant", optimizer), accelerator, 0
    )
    engine = HFEngine(
        learner.policy,
        TokenIdTokenizer(dims.vocab),
        max_batch=cfg.engine.max_batch,
        autocast_dtype=torch.bfloat16 if cfg.model.mixed_precision == "bf16" else None,
    )
    prompt = random_prompt(dims.vocab, s["prompt"])

    def timed(phase):
        """(result, seconds, peak MiB) of phase(), the peak counted from its start."""
        memory.sync()
        memory.reset_peak()
        started = time.perf_counter()
        result = phase()
        memory.sync()
        return result, time.perf_counter() - started, memory.peak()

    generate = lambda tokens: (
        lambda: engine.generate([prompt], cfg.selection.n, replace(cfg.sampling, max_new_tokens=tokens, seed=0))
    )
    kept = lambda rollouts: kept_rollouts(rollouts, cfg.selection.m)
    rollouts, warmup_gen_s, _ = timed(generate(s["warmup_tokens"]))
    _, warmup_update_s, warmup_update_peak = timed(lambda: U.update_policy(learner, kept(rollouts), cfg))
    resting = memory.allocated()  # weights and AdamW's state, between steps
    optimizer_mib = optimizer_state_mib(optimizer)
    rollouts, gen_s, gen_peak = timed(generate(cfg.sampling.max_new_tokens))
    _, update_s, update_peak = timed(lambda: U.update_policy(learner, kept(rollouts), cfg))
    result = {
        "gen_s": round(gen_s, 3),
        "update_s": round(update_s, 3),
        "warmup_gen_s": round(warmup_gen_s, 3),
        "warmup_update_s": round(warmup_update_s, 3),
        "completion_tokens": rollouts.generated_tokens,
        "weights_mib": round(tensor_mib(model.parameters()), 1),
        "optimizer_mib": round(optimizer_mib, 1),
        "resting_mib": resting,
        "peak_gen_mib": gen_peak,
        "peak_update_mib": update_peak,
        "warmup_peak_update_mib": warmup_update_peak,  # before AdamW's state existed
    }
    accelerator.free_memory()  # accelerate keeps references to what it prepared
    return result


def kept_rollouts(rollouts, rows: int) -> list:
    """The first `rows` rollouts of the first prompt as trained sequences, advantages +-0.5."""
    return [
        U.KeptRollout(rollouts.prompt_ids[0], c, float(i % 2) - 0.5)
        for i, c in enumerate(rollouts.completion_ids[0][:rows])
    ]


def plan_row(cfg, dims, hardware: dict, s: dict) -> dict:
    """What `pods-bench plan` predicts for one row, in the measured row's units: the allocator's
    MiB (the framework's share is outside the allocator) and seconds per phase."""
    plan = memory_estimate(cfg, dims, hardware, Lengths(s["prompt"], s["completion"]))
    parts = plan["parts"]
    resting = parts["weights"] + parts["optimizer"] + parts["reference_model"]
    lengths = StepLengths(s["completion"], s["completion"], s["prompt"] + s["completion"])
    seconds = predict(from_hardware(cfg, dims, hardware, lengths), cfg, 1, lengths)
    mib = lambda b: round(b / MIB, 1)
    return {
        "plan_verdict": "fits" if plan["fits"] else "at most" if plan["fits_floor"] else "NO",
        "plan_weights_mib": mib(parts["weights"]),
        "plan_optimizer_mib": mib(parts["optimizer"]),
        "plan_resting_mib": mib(resting),
        "plan_gen_mib": mib(resting + parts["engine"]),
        "plan_update_mib": mib(resting + parts["gradients"] + parts["activations"]),
        "plan_gen_s": round(seconds["gen"], 3),
        "plan_update_s": round(seconds["update"], 3),
    }


def paper_scale(device: str, s: dict, hardware: dict) -> Iterator[dict]:
    """One row per mode and arm, as each finishes. A row the plan says cannot fit (not even its
    weights, optimizer state and gradients) is skipped; one that runs out of memory is recorded,
    its memory released, and the next row runs."""
    import torch

    dims = known_models()[QWEN_3B]
    if device != "cuda":  # the same code path on a model small enough for a CPU
        dims = tiny(dims)
    memory = DeviceMemory(device)
    for mode in MODES:
        for n, m in s["arms"]:
            cfg = paper_config(device, mode, n, m, s)
            row = {"mode": mode, "n": n, "m": m, **plan_row(cfg, dims, hardware, s)}
            if row["plan_verdict"] == "NO":
                yield {**row, "status": "skipped: the plan says it cannot fit"}
                continue
            memory.release()
            try:
                row.update(measure_step(cfg, dims, device, s), status="measured")
            except torch.cuda.OutOfMemoryError as e:
                row.update(status="out of memory", error=str(e).strip().splitlines()[0][:300])
            memory.release()  # after the except block: its traceback held the row's tensors
            yield row


# --- 4. the 8-GPU recipe's process, sharded, on one GPU ----------------------------------------------


def recipe_arms(path: str) -> tuple[dict, dict]:
    """(hardware setup, arm -> trainer config) of an experiment config, resolved as the workflow
    resolves them, without the schema check (jsonschema, which a bare GPU machine may lack; the
    test suite checks the configs against the schema)."""
    import yaml

    experiment = Experiment.from_config(yaml.safe_load((ROOT / path).read_text(encoding="utf-8")))
    hardware = hardware_setup(experiment.hardware)
    return hardware, resolve_runs(experiment, hardware)[1]


def at_shapes(cfg, device: str, s: dict):
    """The recipe's config on this device, its prompt and completion limits those of `s` where set."""
    prompt = s["prompt"] or cfg.task.max_prompt_tokens
    completion = s["completion"] or cfg.sampling.max_new_tokens
    return replace(
        cfg,
        device=device,
        task=replace(cfg.task, max_prompt_tokens=prompt),
        sampling=replace(cfg.sampling, max_new_tokens=completion),
        budget=replace(cfg.budget, max_steps=1),
    )


def per_process(cfg, processes: int) -> dict:
    """One process's share of a step of `cfg` over `processes` (uniform allocation)."""
    trained = trained_per_process(cfg, processes)
    return {
        "prompts": cfg.prompts_per_step // processes,
        "generated": sequences_per_process(cfg, processes),
        "trained": trained,
        "micro_batches": math.ceil(trained / cfg.optim.micro_batch_size),
    }


@contextmanager
def process_group(device: str):
    """A process group of one (NCCL on a GPU, gloo on CPU, an in-memory store: no port, no network)
    for FSDP, unless one exists (then it is used as it is and left alone)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise PodsBenchError("gpu-check: the sharded part runs in a process group of one process")
        yield dist.get_backend()
        return
    if device == "cuda":
        torch.cuda.set_device(0)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield backend
    finally:
        dist.destroy_process_group()


class _PhaseProbe:
    """Seconds and peak memory (allocated, reserved) of one generate call on the gathered weights and
    of one update. The update is split where the optimizer step begins (a step pre-hook): the
    update's phase holds the forward/backward passes and the gradient clipping, the step's AdamW."""

    def __init__(self, memory, model, engine, learner, optimizer, prompt, generated: int, cfg):
        self.memory, self.model, self.engine, self.learner = memory, model, engine, learner
        self.prompt, self.generated, self.cfg = prompt, generated, cfg
        self.marks: dict[str, tuple] = {}
        self.hooks = [
            optimizer.register_step_pre_hook(self._before_step),
            optimizer.register_step_post_hook(lambda *_: self._mark("step")),
        ]

    def _mark(self, name: str) -> None:
        self.memory.sync()
        self.marks[name] = (time.perf_counter(), self.memory.peak(), self.memory.peak_reserved())

    def _before_step(self, *_) -> None:
        self._mark("update")
        self.memory.reset_peak()

    def generate(self, tokens: int):
        memory = self.memory
        memory.sync()
        memory.reset_peak()
        started = time.perf_counter()
        with gathered(self.model, self.engine):  # the whole model in bf16 while HF generate samples
            rollouts = self.engine.generate(
                [self.prompt], self.generated, replace(self.cfg.sampling, max_new_tokens=tokens, seed=0)
            )
        memory.sync()
        return rollouts, time.perf_counter() - started, memory.peak(), memory.peak_reserved()

    def update(self, rows: list) -> dict:
        self.memory.sync()
        self.memory.reset_peak()
        started = time.perf_counter()
        U.update_policy(self.learner, rows, self.cfg)
        (update_end, update_peak, update_reserved), (step_end, step_peak, step_reserved) = (
            self.marks["update"],
            self.marks["step"],
        )
        return {
            "update_s": update_end - started,
            "peak_update_mib": update_peak,
            "peak_update_reserved_mib": update_reserved,
            "step_s": step_end - update_end,
            "peak_step_mib": step_peak,
            "peak_step_reserved_mib": step_reserved,
        }

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()


def measure_sharded(cfg, dims, device: str, s: dict, processes: int) -> dict:
    """One process of `processes` at world size 1: the policy (random weights, `cfg.model.dtype`)
    sharded by pods_bench.sharding.shard as the trainer shards it, one generate call of the
    process's rows on the gathered weights, the update of its trained rows, the optimizer step.
    A warm-up first (a generate call of `warmup_tokens`, an update of one micro-batch: kernels,
    AdamW's state); then each phase timed by `_PhaseProbe`, with the allocator's allocated and
    reserved peaks counted from its start."""
    import torch
    from accelerate import Accelerator
    from transformers import get_scheduler

    shape = per_process(cfg, processes)
    memory = DeviceMemory(device)
    before = memory.allocated()  # what earlier parts left allocated, if anything (counted in every peak)
    with process_group(device) as backend:
        policy = build_random_model(dims, cfg.model.dtype, device)
        if cfg.model.gradient_checkpointing:
            policy.gradient_checkpointing_enable()  # as pods_bench.checkpoint.load_policy does
        model = shard(policy, cfg, torch.device(device))
        accelerator = Accelerator(cpu=device != "cuda")  # one process: backward and clipping as the trainer's
        optimizer = U.make_optimizer(model, cfg, 1)
        scheduler = get_scheduler("constant", optimizer)
        learner = U.Learner(model, model, None, optimizer, scheduler, accelerator, TokenIdTokenizer.pad_token_id)
        engine = start_hf_engine(engine_setup(cfg), model, TokenIdTokenizer(dims.vocab))
        prompt = random_prompt(dims.vocab, cfg.task.max_prompt_tokens)
        probe = _PhaseProbe(memory, model, engine, learner, optimizer, prompt, shape["generated"], cfg)
        try:
            rollouts, warmup_gen_s, warmup_gen_peak, _ = probe.generate(s["warmup_tokens"])
            warmup = probe.update(kept_rollouts(rollouts, cfg.optim.micro_batch_size))  # allocates AdamW's state
            resting, resting_reserved = memory.allocated(), memory.reserved()
            rollouts, gen_s, gen_peak, gen_reserved = probe.generate(cfg.sampling.max_new_tokens)
            timed = probe.update(kept_rollouts(rollouts, shape["trained"]))
        finally:
            probe.close()
        result = {
            "backend": backend,
            "world_size": 1,
            "allocated_before_mib": before,
            **shape,
            "prompt_tokens": cfg.task.max_prompt_tokens,
            "completion_tokens": rollouts.generated_tokens,
            "weights_mib": round(tensor_mib(model.parameters()), 1),
            "optimizer_mib": round(optimizer_state_mib(optimizer), 1),
            "resting_mib": resting,
            "resting_reserved_mib": resting_reserved,
            "gen_s": round(gen_s, 3),
            "peak_gen_mib": gen_peak,
            "peak_gen_reserved_mib": gen_reserved,
            **{k: round(v, 3) if k.endswith("_s") else v for k, v in timed.items()},
            "warmup_gen_s": round(warmup_gen_s, 3),
            "warmup_peak_gen_mib": warmup_gen_peak,  # the prompt's prefill copied to every row, few decoding steps
            "warmup_update_s": round(warmup["update_s"], 3),
            "warmup_step_s": round(warmup["step_s"], 3),
            "warmup_peak_step_mib": warmup["peak_step_mib"],  # AdamW's state allocated in this step
        }
    return result


def sharded_plan(cfg, dims, hardware: dict, lengths: Lengths) -> dict:
    """The plan's memory per phase (the allocator's share: no framework overhead), per device of the
    recipe's K processes and at world size 1, where FSDP's shards of the float32 weights, gradients,
    AdamW state and its step temporaries are whole (K times the 1/K the plan counts); the gathered
    bf16 weights, activations and the KV cache are the same at any world size."""
    estimate = memory_estimate(cfg, dims, hardware, lengths)
    parts, k = estimate["parts"], hardware["processes"]
    sharded = ("weights", "gradients", "optimizer", "optimizer_step")

    def phases(p):
        resting = p["weights"] + p["optimizer"] + p["reference_model"]
        return {
            "resting": resting,
            "gen": resting + p["gathered_weights"] + p["engine"],
            "update": resting + p["gradients"] + p["activations"] + p["gathered_units"],
            "step": resting + p["gradients"] + p["optimizer_step"],
        }

    mib = lambda values: {key: round(v / MIB, 1) for key, v in values.items()}
    return {
        "processes": k,
        "verdict": "fits" if estimate["fits"] else "at most" if estimate["fits_floor"] else "NO",
        "peak_gib": round(estimate["peak"] / GIB, 2),
        "capacity_gib": round(estimate["capacity"] / GIB, 2),
        "framework_gib": round(parts["framework"] / GIB, 2),
        "per_device": mib(phases(parts)),
        "world_size_1": mib(phases({**parts, **{key: parts[key] * k for key in sharded}})),
    }


PHASES = ("resting", "gen", "update", "step")


def predicted_per_device(measured: dict, plan: dict) -> dict:
    """The measurement at world size 1 carried over to one process of K: each phase's allocated and
    reserved peak less what the plan says the whole shards add over 1/K of them ((K-1)/K of the
    float32 weights, gradients, AdamW state and step temporaries), plus the framework's share."""
    out = {}
    for phase in PHASES:
        shards = plan["world_size_1"][phase] - plan["per_device"][phase]
        for kind, key in (("allocated", f"peak_{phase}_mib"), ("reserved", f"peak_{phase}_reserved_mib")):
            if phase == "resting":
                key = "resting_mib" if kind == "allocated" else "resting_reserved_mib"
            value = measured.get(key)
            out[f"{phase}_{kind}_mib"] = None if value is None else round(value - shards, 1)
    reserved = [out[f"{phase}_reserved_mib"] for phase in PHASES]
    if None not in reserved:
        peak = max(reserved) / 1024 + plan["framework_gib"]
        out["peak_gib"] = round(peak, 2)
        out["fits"] = peak <= plan["capacity_gib"]
    return out


def sharded_part(device: str, s: dict, hardware: dict) -> Iterator[dict]:
    """One row per arm of SHARDED_RECIPE. The per-process shapes of its arms differ only in the
    rows trained (GRPO's 512 against PODS's 128, micro-batches of 32): the generate call (512 rows),
    the micro-batch's peak and the step are the same. So one process is measured, with the arm
    that trains fewest rows, and each arm gets its plan and its update time (another arm's from
    the measured time per micro-batch, marked `update_from`). Skipped when the plan at world size 1
    (with the framework's share) exceeds this device's memory (`hardware`)."""
    import torch

    recipe_hardware, arms = recipe_arms(SHARDED_RECIPE)
    processes = recipe_hardware["processes"]
    configs = {arm: at_shapes(cfg, device, s) for arm, cfg in arms.items()}
    dims = known_models()[next(iter(configs.values())).model.name]
    if device != "cuda":
        dims = tiny(dims)
    measured_arm = min(configs, key=lambda arm: per_process(configs[arm], processes)["trained"])
    cfg = configs[measured_arm]
    lengths = Lengths(cfg.task.max_prompt_tokens, cfg.sampling.max_new_tokens)
    whole = sharded_plan(cfg, dims, recipe_hardware, lengths)
    need = max(whole["world_size_1"].values()) / 1024 + whole["framework_gib"]
    capacity = hardware["accelerator"]["memory_gib"]
    memory = DeviceMemory(device)
    memory.release()
    if need > capacity:
        measured = {
            "status": f"skipped: the plan at world size 1 needs {need:.1f} GiB of this device's {capacity:.1f}"
        }
    else:
        try:
            measured = {**measure_sharded(cfg, dims, device, s, processes), "status": "measured"}
        except torch.cuda.OutOfMemoryError as e:
            measured = {"status": "out of memory", "error": str(e).strip().splitlines()[0][:300]}
    memory.release()
    per_micro = measured["update_s"] / measured["micro_batches"] if "update_s" in measured else None
    for arm, arm_cfg in configs.items():
        shape = per_process(arm_cfg, processes)
        step_lengths = StepLengths(lengths.completion, lengths.completion, lengths.prompt + lengths.completion)
        seconds = predict(
            from_hardware(arm_cfg, dims, {**hardware, "processes": processes}, step_lengths),
            arm_cfg,
            processes,
            step_lengths,
        )
        plan = sharded_plan(arm_cfg, dims, recipe_hardware, lengths)
        row = {"recipe": SHARDED_RECIPE, "arm": arm, "hardware": recipe_hardware["description"], **shape}
        row |= {"prompt_tokens": lengths.prompt, "max_new_tokens": lengths.completion, "plan": plan}
        row |= {"plan_gen_s": round(seconds["gen"], 3), "plan_update_s": round(seconds["update"], 3)}
        if arm == measured_arm:
            row |= measured
        else:
            row |= {k: v for k, v in measured.items() if k not in ("trained", "micro_batches", "update_s", "step_s")}
            if per_micro is not None:
                row |= {"update_s": round(per_micro * shape["micro_batches"], 3), "step_s": measured["step_s"]}
                row["update_from"] = f"{measured_arm}: {shape['micro_batches']} x its seconds per micro-batch"
        if measured["status"] == "measured":
            row["predicted_per_device"] = predicted_per_device(row, plan)
        yield row


# --- 5. the 7B recipe's generate call ----------------------------------------------------------------


def measure_generate(cfg, dims, device: str, s: dict, rows: int) -> dict:
    """One HF generate call of `rows` rows on bf16 weights of `dims` (random): a warm-up call of
    `warmup_tokens` new tokens (kernels; its peak is mostly the KV cache of the prompt, prefilled once
    and copied to every row), then the timed one."""
    import torch

    memory = DeviceMemory(device)
    before = memory.allocated()  # what earlier parts left allocated, if anything (counted in the peaks)
    model = build_random_model(dims, "bfloat16", device)
    engine = HFEngine(model, TokenIdTokenizer(dims.vocab), max_batch=cfg.engine.max_batch)
    prompt = random_prompt(dims.vocab, cfg.task.max_prompt_tokens)

    def generate(tokens: int):
        memory.sync()
        memory.reset_peak()
        started = time.perf_counter()
        with torch.no_grad():
            rollouts = engine.generate([prompt], rows, replace(cfg.sampling, max_new_tokens=tokens, seed=0))
        memory.sync()
        return rollouts, time.perf_counter() - started, memory.peak(), memory.peak_reserved()

    _, warmup_s, warmup_peak, warmup_reserved = generate(s["warmup_tokens"])
    rollouts, gen_s, peak, reserved = generate(cfg.sampling.max_new_tokens)
    result = {
        "allocated_before_mib": before,
        "weights_mib": round(tensor_mib(model.parameters()), 1),
        "completion_tokens": rollouts.generated_tokens,
        "gen_s": round(gen_s, 3),
        "peak_gen_mib": peak,
        "peak_gen_reserved_mib": reserved,
        "warmup_tokens": s["warmup_tokens"],
        "warmup_gen_s": round(warmup_s, 3),
        "warmup_peak_gen_mib": warmup_peak,
        "warmup_peak_gen_reserved_mib": warmup_reserved,
    }
    return result


def generate_part(device: str, s: dict, hardware: dict) -> dict:
    """GENERATE_RECIPE's generate call: engine.max_batch rows (all of one process's rows when they
    are fewer), its prompt length, `s["completion"]` new tokens; the plan's generation memory (the
    gathered bf16 weights, the KV cache and the decoding logits) at the lengths measured and at the
    recipe's, and its peak per device of the recipe. Skipped when the plan's generation memory at
    the lengths measured exceeds this device's (`hardware`)."""
    import torch

    recipe_hardware, arms = recipe_arms(GENERATE_RECIPE)
    recipe_cfg = next(iter(arms.values()))
    cfg = at_shapes(recipe_cfg, device, s)
    dims = known_models()[cfg.model.name]
    if device != "cuda":
        dims = tiny(dims)
    rows = min(cfg.engine.max_batch, sequences_per_process(cfg, recipe_hardware["processes"]))
    lengths = Lengths(cfg.task.max_prompt_tokens, cfg.sampling.max_new_tokens)
    full = Lengths(recipe_cfg.task.max_prompt_tokens, recipe_cfg.sampling.max_new_tokens)
    if device != "cuda":
        full = lengths
    plan = lambda at: memory_estimate(cfg, dims, recipe_hardware, at)
    generation = lambda estimate: round((estimate["parts"]["gathered_weights"] + estimate["parts"]["engine"]) / MIB, 1)
    row = {
        "recipe": GENERATE_RECIPE,
        "model": cfg.model.name,
        "rows": rows,
        "prompt_tokens": lengths.prompt,
        "new_tokens": lengths.completion,
        "recipe_new_tokens": full.completion,
        "plan_gen_mib": generation(plan(lengths)),
        "plan_gen_mib_recipe": generation(plan(full)),
        "plan_peak_gib_per_device": round(plan(full)["peak"] / GIB, 2),
        "capacity_gib": recipe_hardware["accelerator"]["memory_gib"],
    }
    capacity = hardware["accelerator"]["memory_gib"]
    if row["plan_gen_mib"] / 1024 > capacity:
        return {
            **row,
            "status": f"skipped: the plan needs {row['plan_gen_mib'] / 1024:.1f} GiB of this device's {capacity:.1f}",
        }
    memory = DeviceMemory(device)
    memory.release()
    try:
        row.update(measure_generate(cfg, dims, device, s, rows), status="measured")
    except torch.cuda.OutOfMemoryError as e:
        row.update(status="out of memory", error=str(e).strip().splitlines()[0][:300])
    memory.release()
    return row


# --- the report --------------------------------------------------------------------------------------


def describe_tests(result: dict | None) -> str:
    if result is None:
        return "not run yet"
    if not result["ran"] or "summary" not in result:
        return ("FAILED: " if result["passed"] is False else "") + result["why"]
    return ("passed" if result["passed"] else "FAILED") + f" ({result['summary']})"


def markdown(report: dict) -> str:
    lines = [f"# GPU check: {report['hardware_setup']} ({report['device']})", ""]
    if not report["complete"]:
        lines += ["**Incomplete**: the check stopped before its end; below is what it measured.", ""]
    lines += [f"- CUDA tests: {describe_tests(report['cuda_tests'])}"]
    if "seconds" in report:
        lines.append(f"- total: {report['seconds']:.0f} s")
    if report.get("part_seconds"):
        lines.append("- seconds per part: " + ", ".join(f"{k} {v:g}" for k, v in report["part_seconds"].items()))
    lines += [
        "",
        "## Smoke model",
        "",
        "| arm | steps | s/step | gen s | reward s | update s | reward first -> last |",
        "|" + " --- |" * 7,
    ]
    for r in report["smoke"]:
        lines.append(
            f"| {r['arm']} | {r['steps']} | {r['s_per_step']} | {r['gen_s']} | {r['reward_s']} | {r['update_s']} | {r['reward_first']} -> {r['reward_last']} |"
        )
    lines += ["", f"## Paper scale ({report['shapes']['prompt']} + {report['shapes']['completion']} tokens)", ""]
    lines += [
        "Measured (plan). Times and peaks are the second generation and update; MiB are the CUDA "
        "allocator's (none on CPU).",
        "",
        "| mode | n/m | plan | status | gen s | update s | resting MiB | peak gen MiB | peak update MiB | first update s |",
        "|" + " --- |" * 10,
    ]
    for r in report["paper_scale"]:
        pair = lambda key, plan: f"{'-' if r.get(key) is None else r[key]} ({r[plan]})"
        lines.append(
            f"| {r['mode']} | {r['n']}/{r['m']} | {r['plan_verdict']} | {r['status']} | {pair('gen_s', 'plan_gen_s')} | "
            f"{pair('update_s', 'plan_update_s')} | {pair('resting_mib', 'plan_resting_mib')} | "
            f"{pair('peak_gen_mib', 'plan_gen_mib')} | {pair('peak_update_mib', 'plan_update_mib')} | "
            f"{r.get('warmup_update_s', '')} |"
        )
    lines += sharded_markdown(report["sharded"]) + generate_markdown(report["generate"])
    return "\n".join(lines) + "\n"


def dash(value) -> str:
    return "-" if value is None else str(value)


def sharded_markdown(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    first = rows[0]
    lines = [
        "",
        f"## The 8-GPU recipe's process, sharded ({first['recipe']}, FSDP2 at world size 1)",
        "",
        f"One process of {first['plan']['processes']} ({first['hardware']}): {first['prompts']} prompt, "
        f"{first['generated']} rows generated in one call, {first['prompt_tokens']} prompt + "
        f"{first['max_new_tokens']} new tokens; status: {first['status']}"
        + (f" ({first['error']})" if "error" in first else "")
        + ". MiB are the CUDA allocator's (none on CPU): allocated / reserved peaks of each phase, "
        "the plan at world size 1 (the shards whole) and per device of the recipe, and the "
        "measurement carried over to one device of the recipe (less the plan's (K-1)/K of the shards).",
        "",
        "| arm | rows trained | micro-batches | plan per device | gen s | update s | step s |",
        "|" + " --- |" * 7,
    ]
    for r in rows:
        plan = r["plan"]
        update = dash(r.get("update_s")) + (" (from the measured arm)" if "update_from" in r else "")
        lines.append(
            f"| {r['arm']} | {r['trained']} | {r['micro_batches']} | {plan['verdict']}, {plan['peak_gib']} of "
            f"{plan['capacity_gib']} GiB | {dash(r.get('gen_s'))} ({r['plan_gen_s']}) | {update} ({r['plan_update_s']}) | "
            f"{dash(r.get('step_s'))} |"
        )
    measured = next((r for r in rows if "update_from" not in r), first)
    plan, carried = measured["plan"], measured.get("predicted_per_device", {})
    lines += [
        "",
        f"Phases, measured on {measured['arm']}:",
        "",
        "| phase | allocated MiB | reserved MiB | plan, world size 1 | plan per device | carried over: allocated / reserved |",
        "|" + " --- |" * 6,
    ]
    keys = {
        "resting": ("resting_mib", "resting_reserved_mib"),
        "gen": ("peak_gen_mib", "peak_gen_reserved_mib"),
        "update": ("peak_update_mib", "peak_update_reserved_mib"),
        "step": ("peak_step_mib", "peak_step_reserved_mib"),
    }
    for phase, (allocated, reserved) in keys.items():
        lines.append(
            f"| {phase} | {dash(measured.get(allocated))} | {dash(measured.get(reserved))} | "
            f"{plan['world_size_1'][phase]} | {plan['per_device'][phase]} | "
            f"{dash(carried.get(f'{phase}_allocated_mib'))} / {dash(carried.get(f'{phase}_reserved_mib'))} |"
        )
    if "fits" in carried:
        lines += [
            "",
            f"Carried over to one device of the recipe: {carried['peak_gib']} GiB reserved at the peak with the "
            f"framework's {plan['framework_gib']} GiB, of {plan['capacity_gib']}: "
            + ("fits." if carried["fits"] else "**does not fit**."),
        ]
    return lines


def generate_markdown(row: dict | None) -> list[str]:
    if row is None:
        return []
    status = row["status"] + (f" ({row['error']})" if "error" in row else "")
    return [
        "",
        f"## The 7B recipe's generate call ({row['recipe']}, {row['model']} dimensions, bf16)",
        "",
        f"{row['rows']} rows, {row['prompt_tokens']} prompt + {row['new_tokens']} new tokens (the recipe: "
        f"{row['recipe_new_tokens']}); status: {status}. The plan: the gathered bf16 weights, the KV cache "
        "and the decoding logits.",
        "",
        "| gen s | allocated peak MiB | reserved peak MiB | plan MiB | plan at the recipe's length MiB | "
        "warm-up peak MiB (prompt KV) | plan peak per device GiB |",
        "|" + " --- |" * 7,
        f"| {dash(row.get('gen_s'))} | {dash(row.get('peak_gen_mib'))} | {dash(row.get('peak_gen_reserved_mib'))} | "
        f"{row['plan_gen_mib']} | {row['plan_gen_mib_recipe']} | {dash(row.get('warmup_peak_gen_mib'))} | "
        f"{row['plan_peak_gib_per_device']} of {row['capacity_gib']} |",
    ]


def gpu_check(out, device: str = "auto") -> dict:
    import torch

    # the allocator as the training and evaluation jobs run it (expandable segments unless the user
    # set one), so that the reserved peaks measured here are the ones a run would see
    allocator = configure_allocator()

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PodsBenchError("gpu-check --device cuda: no GPU is visible")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PodsBenchError(f"gpu-check --out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    s = shapes(device)
    setup, hardware = hardware_for(device)
    report = {
        "device": device,
        "hardware_setup": setup,
        "capacity_gib": round(hardware["accelerator"]["memory_gib"], 2),
        "hardware": run_info.hardware(),
        "cuda_allocator": allocator,
        "packages": run_info.package_versions(),
        "shapes": s,
        "complete": False,
        "cuda_tests": None,
        "smoke": [],
        "paper_scale": [],
        "sharded": [],
        "generate": None,
        "part_seconds": {},  # wall seconds of each part, as it finishes
    }

    def write_report():
        atomic_write_json(out / "gpu_check.json", report)
        atomic_write_text(out / "gpu_check.md", markdown(report))

    write_report()
    clock = time.perf_counter()

    def part_done(name: str):
        nonlocal clock
        report["part_seconds"][name] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()
        write_report()

    report["cuda_tests"] = cuda_tests(device, out)
    part_done("cuda_tests")
    for row in smoke_training(device, out, s["smoke"]):
        report["smoke"].append(row)
        write_report()
    part_done("smoke")
    for row in paper_scale(device, s, hardware):
        report["paper_scale"].append(row)
        write_report()
    part_done("paper_scale")
    for row in sharded_part(device, s["sharded"], hardware):
        report["sharded"].append(row)
        write_report()
    part_done("sharded")
    report["generate"] = generate_part(device, s["generate"], hardware)
    part_done("generate")
    report["complete"] = True
    report["seconds"] = time.perf_counter() - started
    write_report()
    return report


def exit_status(report: dict) -> int:
    """1 when the CUDA tests failed, timed out or could not run on a GPU; else 0. A row that ran out
    of memory is a measurement (the plan's verdict is beside it), not a failure of the check."""
    return 1 if report["cuda_tests"]["passed"] is False else 0


def cli(args) -> int:
    report = gpu_check(args.out, args.device)
    print(markdown(report))
    print(f"wrote {Path(args.out) / 'gpu_check.json'} and gpu_check.md")
    status = exit_status(report)
    if status:
        print(f"gpu-check: the CUDA tests {describe_tests(report['cuda_tests'])}", file=sys.stderr)
    return status
