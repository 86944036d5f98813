"""`make gpu-check` (`pods-bench gpu-check --out DIR`): what pods-bench does on this machine's GPU,
measured in one short run and compared with `pods-bench plan`'s predictions.

    1. the CUDA tests (tests/test_cuda.py, marker `cuda`)
    2. the smoke model trained with GRPO and PODS for a few dozen steps (bf16 autocast, HF engine)
    3. at the paper's scale: a randomly initialised model with Qwen2.5-3B's dimensions (built from
       config/models.yaml, nothing downloaded), 512 prompt + 512 completion tokens, GRPO 16/16 and
       PODS 64/16, one LoRA step and one full fine-tuning step (fp32 master weights, bf16 autocast):
       generation and update time and peak memory, beside the plan's memory and datasheet times

Writes DIR/gpu_check.json and DIR/gpu_check.md. Without a GPU (or with --device cpu) the same
steps run with tiny shapes, so that CI checks the script itself. No network, no vLLM; the smoke
training grades with math-verify as every run does.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from pods_bench.errors import PodsBenchError

ROOT = Path(__file__).resolve().parents[1]
QWEN_3B = "Qwen/Qwen2.5-3B-Instruct"


def shapes(device: str) -> dict:
    """The paper's scale on a GPU; a tiny stand-in on CPU."""
    if device == "cuda":
        smoke = {"steps": 30, "prompts": 8, "arms": [(16, 16), (16, 4)], "new_tokens": 32}
        return {"prompt": 512, "completion": 512, "arms": [(16, 16), (64, 16)], "micro": 4, "smoke": smoke}
    smoke = {"steps": 2, "prompts": 4, "arms": [(8, 8), (8, 2)], "new_tokens": 16}
    return {"prompt": 16, "completion": 16, "arms": [(4, 4), (8, 4)], "micro": 4, "smoke": smoke}


def hardware_for(device: str) -> tuple[str, dict]:
    """The setup of config/hardware.yaml whose accelerator this machine's is (by GPU name), one process."""
    import torch

    from pods_bench.experiment import hardware_setup

    if device != "cuda":
        return "cpu", hardware_setup("cpu")
    name = torch.cuda.get_device_name(0)
    for key, setup in (("H200", "h200"), ("H100", "h100x8"), ("A100", "a100x8"), ("L40S", "l40s")):
        if key in name:
            return setup, {**hardware_setup(setup), "processes": 1}
    memory = torch.cuda.get_device_properties(0).total_memory / 2**30
    fallback = hardware_setup("h100x8")  # datasheet numbers of a known GPU, this one's memory
    return f"{name} (H100 datasheet)", {
        **fallback,
        "processes": 1,
        "accelerator": {**fallback["accelerator"], "memory_gib": memory},
    }


# --- 1. the CUDA tests -------------------------------------------------------------------------------


def cuda_tests(device: str) -> dict:
    if device != "cuda":
        return {"ran": False, "why": "no GPU: tests/test_cuda.py skips itself"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "cuda",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "test_cuda.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    return {"ran": True, "returncode": out.returncode, "summary": (out.stdout.strip().splitlines() or [""])[-1]}


# --- 2. the smoke model ------------------------------------------------------------------------------


def smoke_training(device: str, out: Path, smoke: dict) -> list[dict]:
    """GRPO n/n and PODS n/m (max-variance) on the arith task, the tiny model from scratch."""
    from pods_bench.config import config_from_dict
    from pods_bench.io import read_jsonl
    from pods_bench.train import train

    rows = []
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
        log = read_jsonl(out / "smoke" / arm / "train_log.jsonl")
        mean = lambda key: sum(r[key] for r in log) / len(log)
        rows.append(
            {
                "arm": arm,
                "steps": len(log),
                "s_per_step": round(log[-1]["train_time_s"] / len(log), 4),
                **{f"{p}_s": round(mean(f"time_{p}_s"), 4) for p in ("gen", "reward", "update", "sync")},
                "reward_first": round(log[0]["reward_mean"], 3),
                "reward_last": round(log[-1]["reward_mean"], 3),
            }
        )
    return rows


# --- 3. the paper's scale ----------------------------------------------------------------------------


def paper_config(device: str, lora: bool, n: int, m: int, s: dict):
    from pods_bench.config import config_from_dict

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


def random_model(dims, cfg, device: str):
    """A randomly initialised causal LM with `dims` (Qwen2 architecture), built on the device."""
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
    )
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, cfg.model.dtype))
    model.generation_config.eos_token_id = None  # a random model decodes to the length limit
    return model


class _Tokenizer:
    """Just enough of a tokenizer for HFEngine on token-id prompts (the prompt 'text' is ids joined by
    spaces): nothing is downloaded, and the prompt length is exact."""

    pad_token_id = eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(t) for t in text.split()]}

    def pad(self, batch, padding=True, padding_side="left", return_tensors="pt"):
        import torch

        rows = batch["input_ids"]
        width = max(map(len, rows))
        ids = [[0] * (width - len(r)) + r for r in rows]
        mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def measure_step(cfg, dims, device: str, s: dict) -> dict:
    """One generation of n rollouts and one update on m of them: seconds and peak memory of each."""
    import torch
    from accelerate import Accelerator
    from transformers import get_scheduler

    from pods_bench import train as T
    from pods_bench.engines.hf import HFEngine

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    peak = (lambda: torch.cuda.max_memory_allocated() / 2**20) if cuda else (lambda: None)  # MiB
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    policy = random_model(dims, cfg, device)
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
    accelerator = Accelerator(cpu=not cuda, mixed_precision=cfg.model.mixed_precision)
    model = accelerator.prepare(policy)
    optimizer = T.make_optimizer(model, cfg, 1)
    learner = T.Learner(
        model, accelerator.unwrap_model(model), None, optimizer, get_scheduler("constant", optimizer), accelerator, 0
    )
    engine = HFEngine(
        learner.policy,
        _Tokenizer(),
        max_batch=cfg.engine.max_batch,
        autocast_dtype=torch.bfloat16 if cfg.model.mixed_precision == "bf16" else None,
    )
    g = torch.Generator().manual_seed(0)
    prompt = " ".join(map(str, torch.randint(1, dims.vocab, (s["prompt"],), generator=g).tolist()))
    resting = peak()
    sync()
    started = time.perf_counter()
    rollouts = engine.generate([prompt], cfg.selection.n, replace(cfg.sampling, seed=0))
    sync()
    gen_s, gen_peak = time.perf_counter() - started, peak()
    kept = [
        T.KeptRollout(rollouts.prompt_ids[0], c, float(i % 2) - 0.5)
        for i, c in enumerate(rollouts.completion_ids[0][: cfg.selection.m])
    ]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    sync()
    started = time.perf_counter()
    T.update_policy(learner, kept, cfg)
    sync()
    update_s, update_peak = time.perf_counter() - started, peak()
    result = {
        "gen_s": round(gen_s, 3),
        "update_s": round(update_s, 3),
        "completion_tokens": rollouts.generated_tokens,
        # the CUDA allocator's high-water marks (None on CPU: tests/test_planning.py measures it there)
        "peak_gen_mib": gen_peak and round(gen_peak),
        "peak_update_mib": update_peak and round(update_peak),
        "resting_mib": resting and round(resting),
    }
    accelerator.free_memory()  # accelerate keeps references to what it prepared
    del engine, learner, model, policy, optimizer
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def paper_scale(device: str, s: dict, hardware: dict) -> list[dict]:
    from pods_bench.planning.architecture import known_models
    from pods_bench.planning.memory import Lengths, memory_estimate
    from pods_bench.planning.step_time import StepLengths, from_hardware, predict

    dims = known_models()[QWEN_3B]
    if device != "cuda":  # the same code path on a model small enough for a CPU
        dims = replace(dims, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=1000)
    lengths = StepLengths(s["completion"], s["completion"], s["prompt"] + s["completion"])
    rows = []
    for lora in (True, False):
        for n, m in s["arms"]:
            cfg = paper_config(device, lora, n, m, s)
            measured = measure_step(cfg, dims, device, s)
            plan = memory_estimate(cfg, dims, hardware, Lengths(s["prompt"], s["completion"]))
            parts = plan["parts"]
            planned_update = parts["weights"] + parts["optimizer"] + parts["gradients"] + parts["activations"]
            seconds = predict(from_hardware(cfg, dims, hardware, lengths), cfg, 1, lengths)
            rows.append(
                {
                    "mode": "lora" if lora else "full",
                    "n": n,
                    "m": m,
                    **measured,
                    "plan_update_mib": round(planned_update / 2**20, 1),
                    "plan_gen_s": round(seconds["gen"], 3),
                    "plan_update_s": round(seconds["update"], 3),
                }
            )
    return rows


# --- the report --------------------------------------------------------------------------------------


def markdown(report: dict) -> str:
    lines = [f"# GPU check: {report['hardware']['label']} ({report['device']})", ""]
    lines += [f"- CUDA tests: {report['cuda_tests']}", f"- total: {report['seconds']:.0f} s", ""]
    lines += [
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
        "| mode | n/m | gen s (plan) | update s (plan) | peak update MiB (plan) | peak gen MiB |",
        "|" + " --- |" * 6,
    ]
    for r in report["paper_scale"]:
        lines.append(
            f"| {r['mode']} | {r['n']}/{r['m']} | {r['gen_s']} ({r['plan_gen_s']}) | {r['update_s']} ({r['plan_update_s']}) | "
            f"{r['peak_update_mib']} ({r['plan_update_mib']}) | {r['peak_gen_mib']} |"
        )
    return "\n".join(lines) + "\n"


def gpu_check(out, device: str = "auto") -> dict:
    import torch

    from pods_bench import run_info
    from pods_bench.io import atomic_write_json, atomic_write_text

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PodsBenchError("gpu-check --device cuda: no GPU is visible")
    out = Path(out)
    started = time.perf_counter()
    s = shapes(device)
    setup, hardware = hardware_for(device)
    report = {
        "device": device,
        "hardware_setup": setup,
        "hardware": run_info.hardware(),
        "packages": run_info.package_versions(),
        "shapes": s,
        "cuda_tests": cuda_tests(device),
        "smoke": smoke_training(device, out, s["smoke"]),
        "paper_scale": paper_scale(device, s, hardware),
    }
    report["seconds"] = time.perf_counter() - started
    atomic_write_json(out / "gpu_check.json", report)
    atomic_write_text(out / "gpu_check.md", markdown(report))
    return report


def cli(args) -> int:
    report = gpu_check(args.out, args.device)
    print(markdown(report))
    print(f"wrote {Path(args.out) / 'gpu_check.json'} and gpu_check.md")
    return 0
