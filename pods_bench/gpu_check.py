"""`make gpu-check` (`pods-bench gpu-check --out DIR`): what pods-bench does on this machine's GPU,
measured in one short run and compared with `pods-bench plan`'s predictions.

    1. the CUDA tests (tests/test_cuda.py, marker `cuda`), in a subprocess that needs pytest only
    2. the smoke model trained with GRPO and PODS for a few dozen steps (bf16 autocast, HF engine),
       in a fresh DIR/smoke each time (a rerun does not resume the last check's finished runs)
    3. at the paper's scale: a randomly initialised model with Qwen2.5-3B's dimensions (built from
       config/models.yaml, nothing downloaded), 512 prompt + 512 completion tokens, GRPO 16/16 and
       PODS 64/16, LoRA and full fine-tuning (fp32 master weights, bf16 autocast): a warm-up
       generation and update, then a timed generation and a timed second update (the first one
       allocates AdamW's state), with the allocator's resting memory and the peak of each phase,
       beside the plan's memory and step time. A row the plan says cannot fit on this device is
       skipped; one that runs out of memory is recorded as such and the check goes on.

Capacity is what the device reports (a MIG slice, a 40 GB A100, a PCIe or NVL card), the speeds the
datasheet entry of config/hardware.yaml whose name matches. DIR/gpu_check.json and gpu_check.md
are rewritten after every part and row, so an aborted check leaves what it measured ("complete":
false). The exit status is 1 when the CUDA tests failed, timed out or did not run on a GPU.

Without a GPU (or with --device cpu) the same steps run with tiny shapes, so that CI checks the
script itself (tests/test_gpu_check.py). No network, no vLLM; the smoke training grades with
math-verify as every run does.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from pods_bench import run_info
from pods_bench import train as T
from pods_bench.config import config_from_dict
from pods_bench.engines.hf import HFEngine
from pods_bench.errors import PodsBenchError
from pods_bench.experiment import hardware_setup
from pods_bench.io import atomic_write_json, atomic_write_text, read_jsonl
from pods_bench.models import TokenIdTokenizer, build_random_model
from pods_bench.planning.architecture import known_models
from pods_bench.planning.memory import Lengths, memory_estimate
from pods_bench.planning.step_time import StepLengths, from_hardware, predict
from pods_bench.run_dir import TRAIN_LOG, phase_field
from pods_bench.train import train

ROOT = Path(__file__).resolve().parents[1]
QWEN_3B = "Qwen/Qwen2.5-3B-Instruct"
MIB = 2**20
# config/hardware.yaml setups whose datasheet speeds a GPU of that name has (its memory is measured)
DATASHEETS = (("H200", "h200"), ("H100", "h100x8"), ("A100", "a100x8"), ("L40S", "l40s"))
# The fine-tuning modes measured at the paper's scale, one process each. Sharded full fine-tuning
# (one process per GPU, launched by accelerate) joins here once make_learner builds it.
MODES = ("lora", "full")
CUDA_TESTS_TIMEOUT_S = 600


def shapes(device: str) -> dict:
    """The paper's scale on a GPU; a tiny stand-in on CPU."""
    if device == "cuda":
        smoke = {"steps": 30, "prompts": 8, "arms": [(16, 16), (16, 4)], "new_tokens": 32}
        return {"prompt": 512, "completion": 512, "arms": [(16, 16), (64, 16)], "micro": 4, "smoke": smoke}
    smoke = {"steps": 2, "prompts": 4, "arms": [(8, 8), (8, 2)], "new_tokens": 16}
    return {"prompt": 16, "completion": 16, "arms": [(4, 4), (8, 4)], "micro": 4, "smoke": smoke}


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


def tensor_mib(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / MIB


def measure_step(cfg, dims, device: str, s: dict) -> dict:
    """A warm-up generation of n rollouts and update on m of them (kernel selection, allocator
    growth, AdamW's state), then the same timed again: seconds and allocator peaks of each phase."""
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
    optimizer = T.make_optimizer(model, cfg, 1)
    learner = T.Learner(
        model, accelerator.unwrap_model(model), None, optimizer, get_scheduler("constant", optimizer), accelerator, 0
    )
    engine = HFEngine(
        learner.policy,
        TokenIdTokenizer(dims.vocab),
        max_batch=cfg.engine.max_batch,
        autocast_dtype=torch.bfloat16 if cfg.model.mixed_precision == "bf16" else None,
    )
    g = torch.Generator().manual_seed(0)
    prompt = " ".join(map(str, torch.randint(1, dims.vocab, (s["prompt"],), generator=g).tolist()))

    def timed(phase):
        """(result, seconds, peak MiB) of phase(), the peak counted from its start."""
        memory.sync()
        memory.reset_peak()
        started = time.perf_counter()
        result = phase()
        memory.sync()
        return result, time.perf_counter() - started, memory.peak()

    generate = lambda: engine.generate([prompt], cfg.selection.n, replace(cfg.sampling, seed=0))
    kept = lambda rollouts: [
        T.KeptRollout(rollouts.prompt_ids[0], c, float(i % 2) - 0.5)
        for i, c in enumerate(rollouts.completion_ids[0][: cfg.selection.m])
    ]
    rollouts, warmup_gen_s, _ = timed(generate)
    _, warmup_update_s, warmup_update_peak = timed(lambda: T.update_policy(learner, kept(rollouts), cfg))
    resting = memory.allocated()  # weights and AdamW's state, between steps
    optimizer_mib = tensor_mib(t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))
    rollouts, gen_s, gen_peak = timed(generate)
    _, update_s, update_peak = timed(lambda: T.update_policy(learner, kept(rollouts), cfg))
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
        dims = replace(dims, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=1000)
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
    return "\n".join(lines) + "\n"


def gpu_check(out, device: str = "auto") -> dict:
    import torch

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
        "packages": run_info.package_versions(),
        "shapes": s,
        "complete": False,
        "cuda_tests": None,
        "smoke": [],
        "paper_scale": [],
    }

    def write_report():
        atomic_write_json(out / "gpu_check.json", report)
        atomic_write_text(out / "gpu_check.md", markdown(report))

    write_report()
    report["cuda_tests"] = cuda_tests(device, out)
    write_report()
    for row in smoke_training(device, out, s["smoke"]):
        report["smoke"].append(row)
        write_report()
    for row in paper_scale(device, s, hardware):
        report["paper_scale"].append(row)
        write_report()
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
