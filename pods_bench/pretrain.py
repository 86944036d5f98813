"""Supervised warm start of the tiny smoke model on worked solutions.

RL on a pretrained LLM mostly sharpens what the model can already do: greedy decoding is right far
more often than sampling. A tiny model trained to convergence has little such gap, and RL cannot teach
it new arithmetic in a minute. So the warm start is made in two phases:

1. clean: next-token training on the task's worked solutions (loss on completion tokens only), with
   the prompts rendered exactly as the trainer renders them;
2. noise: a short extra phase in which the final answer of a share of the solutions is replaced by
   the gold answer of another random problem. The model keeps computing correctly inside `<think>`
   but learns an uncertain answer: greedy decoding still picks the right answer, sampling at
   temperature 1 often does not, and RL has something to sharpen within seconds.

The result is a standard Hugging Face folder plus `pretrain.json` (settings, their hash, steps, wall
time). A folder holding a finished model for the same settings is reused at once; a new one is built
in a temporary folder beside it and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pods_bench.errors import PodsBenchError
from pods_bench.io import atomic_write_json
from pods_bench.models import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model
from pods_bench.tasks import get_task
from pods_bench.tasks.prompts import build_prompt

PRETRAIN_FORMAT = 1  # bump when the training recipe's code changes, so cached folders are rebuilt
META_FILE = "pretrain.json"
ANSWER_BLOCK = re.compile(r"<answer>.*?</answer>", re.DOTALL)


# The smoke recipe: each default with the reason for it (measurements in docs/smoke-model.md).
@dataclass(frozen=True)
class PretrainConfig:
    # 0.80M parameters (Llama, hidden 128, 4 layers, ffn 384): at this size a GRPO step's update of
    # 8 x 16 sequences costs ~2x its sampling (1.2 s vs 0.6 s on one core), the cost structure PODS
    # exploits. (A 0.1M model learns from about as many samples, but its updates cost little.)
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    task: str = "arith"  # learnable on a CPU, graded by the same verifier and format as the real tasks
    # Prompts exactly as the trainer renders them, so its task.prompt_style / task.system_prompt must
    # be the same: no system instructions, as the official ones add ~260 tokens to every sequence.
    prompt_style: str = "instruct"
    system_prompt: str | None = ""
    # 720 steps of 64 (~250 s on 2 cores, 0.35 s a step): accuracy only takes off after ~200 steps.
    # At 480 the warm start still depended on the CPU and the seed (GRPO from it reached 0.63-0.77 in
    # 30 steps); from 720-step warm starts GRPO's curve bends within 30 steps (docs/smoke-model.md).
    # A step count, not seconds, so that a slow machine builds the same recipe.
    steps: int = 720
    seconds: float | None = None  # optional wall-clock cap; training stops at steps or seconds, whichever first
    # The last 10 % of the steps (72) on partly randomised answers: sampled accuracy drops from 0.72
    # to 0.28 while greedy stays at 0.74 (0.79 before) -- a gap GRPO narrows (to ~0.68) within a minute.
    # From the model before this phase GRPO gained nothing in a minute (0.72 -> 0.66-0.69).
    noise_share: float = 0.1
    noise_fraction: float = 0.5  # half the answers randomised: the right one stays the most likely (greedy)
    batch_size: int = 64  # beat 32 x twice the steps at equal compute (greedy 0.74 vs 0.68)
    lr: float = 3e-3  # tiny models train stably this high; cosine-decayed over the clean phase...
    lr_min_ratio: float = 0.1  # ...to 3e-4, kept through the noise phase (1e-3 there cost greedy accuracy)
    warmup_steps: int = 50
    seed: int = 0
    # torch threads, fixed: a CPU adds floats in an order that depends on the thread count, so the
    # same seed built with 1 or 8 threads is not the model built with 2 (bit-different weights after
    # 40 steps; the 720-step model samples 0.33 built with 1 thread, 0.38 with 2), and the smoke's
    # verdict starts from that model. 2: what a 2-core machine gives it (docs/smoke-model.md).
    threads: int = 2

    def validate(self) -> None:
        if self.steps < 1:
            raise PodsBenchError(f"pretrain steps must be >= 1, got {self.steps}")
        if self.seconds is not None and not self.seconds > 0:
            raise PodsBenchError(f"pretrain seconds must be > 0, got {self.seconds}")
        if not 0 <= self.noise_share < 1:
            raise PodsBenchError(f"pretrain noise_share must be in [0, 1), got {self.noise_share}")
        if not 0 <= self.noise_fraction <= 1:
            raise PodsBenchError(f"pretrain noise_fraction must be in [0, 1], got {self.noise_fraction}")
        if self.batch_size < 1:
            raise PodsBenchError(f"pretrain batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise PodsBenchError(f"pretrain lr must be > 0, got {self.lr}")
        if self.threads < 1:
            raise PodsBenchError(f"pretrain threads must be >= 1, got {self.threads}")


def render_prompt(cfg: PretrainConfig, problem, tokenizer) -> str:
    """The prompt exactly as the trainer renders it with the same style and system prompt."""
    return build_prompt(problem, tokenizer, style=cfg.prompt_style, system_prompt=cfg.system_prompt)


def settings_hash(cfg: PretrainConfig, problems: list, tokenizer) -> str:
    """Identifies a finished model: the settings, the recipe version, every training problem and
    one rendered prompt (so a change of the task's problems or of the prompt template rebuilds)."""
    digest = hashlib.sha256()
    for text in [
        json.dumps(asdict(cfg), sort_keys=True),
        str(PRETRAIN_FORMAT),
        render_prompt(cfg, problems[0], tokenizer),
    ]:
        digest.update(text.encode() + b"\0")
    for p in problems:
        digest.update(f"{p.question}\0{p.solution}\0{p.gold}\0".encode())
    return digest.hexdigest()[:16]


def read_meta(folder: str | Path) -> dict | None:
    path = Path(folder) / META_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def lr_at(cfg: PretrainConfig, progress: float, step: int) -> float:
    """Linear warm-up, cosine decay to lr_min_ratio * lr over the clean phase, then flat."""
    warmup = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
    clean_progress = min(1.0, progress / (1 - cfg.noise_share))
    cosine = 0.5 * (1 + math.cos(math.pi * clean_progress))  # 1 -> 0
    return cfg.lr * warmup * (cfg.lr_min_ratio + (1 - cfg.lr_min_ratio) * cosine)


def randomise_answers(completions: list[str], golds: list[str], fraction: float, rng: random.Random) -> list[str]:
    """Replace the `<answer>` of each completion, with probability `fraction`, by a random gold of
    the training set (plausible answers of the task's own distribution); `<think>` is untouched."""
    return [
        ANSWER_BLOCK.sub(lambda _: f"<answer>{rng.choice(golds)}</answer>", c) if rng.random() < fraction else c
        for c in completions
    ]


def make_batch(prompt_ids, completions, tokenizer):
    """Right-padded input ids, attention mask and labels (-100 except on completion tokens + EOS)."""
    import torch

    completion_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
    seqs = [p + c + [tokenizer.eos_token_id] for p, c in zip(prompt_ids, completion_ids)]
    width = max(map(len, seqs))
    input_ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (p, s) in enumerate(zip(prompt_ids, seqs)):
        input_ids[i, : len(s)] = torch.tensor(s)
        labels[i, len(p) : len(s)] = torch.tensor(s[len(p) :])
        mask[i, : len(s)] = 1
    return input_ids, mask, labels


def training_problems(cfg: PretrainConfig) -> list:
    problems = get_task(cfg.task).load("train")
    if not problems or any(p.solution is None for p in problems):
        raise PodsBenchError(f"task {cfg.task!r} has no worked solutions to warm-start on")
    return problems


def train_warm_start(cfg: PretrainConfig, problems: list, show_progress: bool = True):
    """Build the tiny model and train it on `problems`' worked solutions; returns (model,
    tokenizer, stats), with the recipe's torch threads whatever the machine's."""
    import torch

    cfg.validate()
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, problems, show_progress)
    finally:
        torch.set_num_threads(threads)


def _train(cfg: PretrainConfig, problems: list, show_progress: bool):
    import torch
    from tqdm.auto import tqdm

    tokenizer = build_char_tokenizer()
    golds = [p.gold for p in problems]
    prompt_ids: dict[int, list[int]] = {}  # rendered and tokenized on first use: short runs touch few problems

    def prompts_of(idx: list[int]) -> list[list[int]]:
        new = [i for i in dict.fromkeys(idx) if i not in prompt_ids]
        if new:
            rendered = tokenizer([render_prompt(cfg, problems[i], tokenizer) for i in new], add_special_tokens=False)
            prompt_ids.update(zip(new, rendered["input_ids"]))
        return [prompt_ids[i] for i in idx]

    model = build_tiny_model(cfg.model, tokenizer, seed=cfg.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    start = time.perf_counter()
    noise_steps, loss_ema = 0, None
    bar = tqdm(total=cfg.steps, desc="pretrain", unit="step", disable=not show_progress)
    step = 0
    while step < cfg.steps:
        elapsed = time.perf_counter() - start
        progress = max(step / cfg.steps, elapsed / cfg.seconds if cfg.seconds else 0.0)
        if progress >= 1:
            break
        noisy = progress >= 1 - cfg.noise_share
        idx = [rng.randrange(len(problems)) for _ in range(cfg.batch_size)]
        completions = [problems[i].solution for i in idx]
        if noisy:
            noise_steps += 1
            completions = randomise_answers(completions, golds, cfg.noise_fraction, rng)
        input_ids, mask, labels = make_batch(prompts_of(idx), completions, tokenizer)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, progress, step)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss_ema:.3f}", phase="noise" if noisy else "clean")
    bar.close()
    model.eval()
    stats = {
        "steps": step,
        "clean_steps": step - noise_steps,
        "noise_steps": noise_steps,
        "wall_s": round(time.perf_counter() - start, 2),
        "torch_threads": torch.get_num_threads(),
        "final_loss_ema": round(loss_ema, 4) if loss_ema is not None else None,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return model, tokenizer, stats


def pretrain(cfg: PretrainConfig, out: str | Path, show_progress: bool = True) -> tuple[Path, bool]:
    """Make sure `out` holds a warm-started model for `cfg`. Returns (folder, reused)."""
    import torch
    import transformers

    cfg.validate()
    out = Path(out)
    problems = training_problems(cfg)
    digest = settings_hash(cfg, problems, build_char_tokenizer())
    meta = read_meta(out)
    if meta and meta.get("settings_hash") == digest:  # written last, so its presence means finished
        return out, True
    if out.exists() and (not out.is_dir() or (meta is None and any(out.iterdir()))):
        raise PodsBenchError(f"{out} exists and is not a pretrained-model folder; refusing to overwrite it")

    model, tokenizer, stats = train_warm_start(cfg, problems, show_progress=show_progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_model(model, tokenizer, tmp)
        atomic_write_json(
            tmp / META_FILE,
            {
                "settings_hash": digest,
                "settings": asdict(cfg),
                **stats,
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )
        # rename(2) cannot replace a non-empty folder: move the old one aside first.
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out, False


def cli_pretrain(args) -> int:
    overrides = {"seed": args.seed, "seconds": args.seconds, "steps": args.steps}
    cfg = replace(PretrainConfig(), **{k: v for k, v in overrides.items() if v is not None})
    folder, reused = pretrain(cfg, args.out)
    meta = read_meta(folder)
    what = "reused" if reused else f"trained {meta['steps']} steps in {meta['wall_s']} s"
    print(f"{folder}: {what} (settings {meta['settings_hash']})")
    return 0
