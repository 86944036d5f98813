"""pods-bench's GRPO step beside TRL's GRPOTrainer, on the same model, prompts, reward and settings
(`make bench-peer`; trl is the `bench` extra, not a dependency of pods-bench).

The smoke model (warm start), the smoke task's first training prompts rendered once and handed to
both, pods-bench's reward (math-verify in its grading pool) as TRL's reward function; 8 prompts x 16
completions, 32 new tokens, temperature 1, top-k/top-p off, beta 0, TRL loss_type "grpo" (= pods-bench's
"sequence" aggregation), bf16 and gradient checkpointing off, lr 1e-4, one thread budget for both.
The two trainers run in interleaved pairs whose order alternates (pods-bench first in even pairs, TRL
first in odd ones), so that a machine that speeds up or slows down, or a first-run advantage, touches
both alike; each run's first step is a warm-up and is dropped.

Phases, the same span on both sides:
    generation   tokenise, sample, decode, grade, advantages   (pods-bench: gen + reward + select;
                 TRL: _generate_and_score_completions)
    update       forward/backward, optimizer step, weight sync  (pods-bench: update + sync;
                 TRL: the rest of the optimizer step)
"Same work" is measured, not assumed: each side's mean completion length and mean reward over its
timed steps (pods-bench from its step log, TRL from the completions its reward function grades).

    python -m tests.benchmarks.peer_trl [--pairs 8] [--steps 15] [--out results/bench-peer] [--model DIR]
prints, per pair and overall, the median seconds per phase of each side and their ratio (pods-bench /
TRL) with the spread of the per-pair step ratios (range and a 95 % bootstrap interval of their median)
and the machine's load average; writes the per-step times to <out>/steps.csv, the pairs to
<out>/pairs.csv and the summary to <out>/summary.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WARM_START = Path("results") / "warm_start" / "arith-tiny"  # where the smoke workflow puts it (from the cwd)
PHASES = ("generation", "update", "step")


def pods_bench_config(out: Path, steps: int):
    """The smoke experiment's GRPO arm, as `pods-bench profile` runs it (its training job's config,
    no evaluation, no checkpoints but the first and last), for `steps` steps."""
    from pods_bench.config import config_from_dict
    from pods_bench.planning.profile import arm_configs

    settings, overrides, _ = arm_configs(ROOT / "config" / "smoke.yaml", out)["grpo_n16_m16"]
    settings = {**settings, "model": {**settings["model"], "name": str(WARM_START.resolve())}}
    return config_from_dict(settings, [*overrides, f"budget.max_steps={steps}"])


def run_pods_bench(out: Path, steps: int) -> list[dict]:
    from pods_bench.io import read_jsonl
    from pods_bench.train import train

    cfg = pods_bench_config(out, steps)
    train(cfg, progress=False)
    return [
        {
            "generation": r["time_gen_s"] + r["time_reward_s"] + r["time_select_s"],
            "update": r["time_update_s"] + r["time_sync_s"],
            "completion_len_mean": r["completion_len_mean"],
            "reward_mean": r["reward_mean"],
        }
        for r in read_jsonl(cfg.run_dir / "train_log.jsonl")
    ]


def run_trl(out: Path, steps: int) -> list[dict]:
    """TRL's GRPOTrainer on the same model, prompts and reward, its phases timed from outside."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pods_bench.rewards import RewardFunction, gold_texts
    from pods_bench.train import load_training_prompts

    cfg = pods_bench_config(out / "unused", steps)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(WARM_START)  # the exact char tokenizer
    tokenizer.padding_side = "left"
    problems, prompts, _ = load_training_prompts(cfg, tokenizer)
    count = cfg.prompts_per_step * steps
    golds = gold_texts(problems[:count], cfg.reward.grading)
    dataset = Dataset.from_dict({"prompt": prompts[:count], "gold": golds})
    grader = RewardFunction(cfg.reward)

    # TRL decodes completions without special tokens, which would drop the answer tags of the char
    # tokenizer; grade the text pods-bench's engine decodes instead (all but EOS and padding)
    drop = {tokenizer.eos_token_id, tokenizer.pad_token_id}

    graded: list[dict] = []  # per reward call: what TRL sampled this step, for the "same work" figures

    def reward(prompts, completions, completion_ids, gold, **kwargs):
        texts = [
            tokenizer.decode([t for t in ids if t not in drop], skip_special_tokens=False) for ids in completion_ids
        ]
        total = list(grader(texts, gold).total)
        graded.append({"lengths": [len(ids) for ids in completion_ids], "rewards": total})
        return total

    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=cfg.prompts_per_step * cfg.selection.n,
        num_generations=cfg.selection.n,
        gradient_accumulation_steps=1,
        max_completion_length=cfg.sampling.max_new_tokens,
        temperature=cfg.sampling.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="grpo",
        learning_rate=cfg.optim.lr,
        lr_scheduler_type="constant",
        adam_beta1=cfg.optim.betas[0],
        adam_beta2=cfg.optim.betas[1],
        weight_decay=cfg.optim.weight_decay,
        max_grad_norm=cfg.optim.max_grad_norm,
        max_steps=steps,
        shuffle_dataset=False,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        save_strategy="no",
        report_to=[],
        logging_steps=10**6,
        disable_tqdm=True,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(WARM_START)
    times: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.started, self.generation = time.perf_counter(), 0.0

        def on_step_end(self, *a, **k):
            total = time.perf_counter() - self.started
            sampled = graded[len(times)]  # one generation (one reward call) per optimizer step
            times.append(
                {
                    "generation": self.generation,
                    "update": total - self.generation,
                    "completion_len_mean": statistics.mean(sampled["lengths"]),
                    "reward_mean": statistics.mean(sampled["rewards"]),
                }
            )

    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    generate = trainer._generate_and_score_completions

    def timed_generate(*a, **k):
        started = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            timer.generation += time.perf_counter() - started

    trainer._generate_and_score_completions = timed_generate
    try:
        trainer.train()
    finally:
        grader.close()
    return times


def medians(steps: list[dict]) -> dict:
    return {phase: statistics.median(s[phase] for s in steps) for phase in ("generation", "update")} | {
        "step": statistics.median(s["generation"] + s["update"] for s in steps),
        "completion_len_mean": statistics.mean(s["completion_len_mean"] for s in steps),
        "reward_mean": statistics.mean(s["reward_mean"] for s in steps),
    }


def median_interval(values: list[float], seed: int = 0, draws: int = 10_000) -> tuple[float, float]:
    """95 % bootstrap interval of the median of the per-pair values."""
    import numpy as np

    rng = np.random.default_rng(seed)
    medians_ = np.median(rng.choice(values, size=(draws, len(values)), replace=True), axis=1)
    return float(np.percentile(medians_, 2.5)), float(np.percentile(medians_, 97.5))


def summary(pairs: list[dict], steps: int) -> str:
    """The markdown summary: per-phase medians and ratio, the step ratio's spread, the same-work figures."""
    lines = ["| phase | pods-bench s | TRL s | pods-bench / TRL | per-pair ratios: range | 95 % CI of the median |"]
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for phase in PHASES:
        ratios = [p["ratio"][phase] for p in pairs]
        low, high = median_interval(ratios)
        ours = statistics.median(p["pods-bench"][phase] for p in pairs)
        theirs = statistics.median(p["trl"][phase] for p in pairs)
        lines.append(
            f"| {phase} | {ours:.3f} | {theirs:.3f} | {statistics.median(ratios):.3f} | "
            f"{min(ratios):.3f}-{max(ratios):.3f} | [{low:.3f}, {high:.3f}] |"
        )
    lines += ["", "| side | mean completion tokens | mean reward |", "| --- | --- | --- |"]
    for side in ("pods-bench", "trl"):
        length = statistics.mean(p[side]["completion_len_mean"] for p in pairs)
        reward = statistics.mean(p[side]["reward_mean"] for p in pairs)
        lines.append(f"| {side} | {length:.2f} | {reward:.3f} |")
    loads = [p["load_before"] for p in pairs] + [p["load_after"] for p in pairs]
    lines.append(
        f"\n{len(pairs)} interleaved pairs (order alternating) of {steps} timed steps each; ratios are "
        f"medians of the per-pair ratios; 1-minute load average {min(loads):.2f}-{max(loads):.2f} on "
        f"{os.cpu_count()} CPUs during the runs."
    )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import pandas as pd

    from pods_bench.io import atomic_write_text, atomic_write_with

    global WARM_START
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--steps", type=int, default=15, help="timed steps per run (one more is run as a warm-up)")
    p.add_argument("--out", default=str(Path("results") / "bench-peer"))
    p.add_argument("--model", default=str(WARM_START), help="the warm-started smoke model (built if missing)")
    args = p.parse_args(argv)
    WARM_START = Path(args.model)
    if not (WARM_START / "config.json").is_file():
        from pods_bench.pretrain import PretrainConfig, pretrain

        pretrain(PretrainConfig(), WARM_START)
    out, rows, pairs = Path(args.out), [], []
    runners = {"pods-bench": run_pods_bench, "trl": run_trl}
    for pair in range(args.pairs):
        order = ("pods-bench", "trl") if pair % 2 == 0 else ("trl", "pods-bench")
        record = {"pair": pair, "first": order[0], "load_before": os.getloadavg()[0]}
        for side in order:
            steps = runners[side](out / f"pair{pair}" / side, args.steps + 1)[1:]  # the first step warms up
            rows += [{"pair": pair, "side": side, "step": i + 2, **s} for i, s in enumerate(steps)]
            record[side] = medians(steps)
        record["load_after"] = os.getloadavg()[0]
        record["ratio"] = {k: record["pods-bench"][k] / record["trl"][k] for k in PHASES}
        pairs.append(record)
        print(
            f"pair {pair} ({order[0]} first): pods-bench {record['pods-bench']['step']:.3f} s/step, TRL "
            f"{record['trl']['step']:.3f}; "
            + ", ".join(f"{k} {v:.3f}" for k, v in record["ratio"].items())
            + " (pods-bench / TRL)",
            flush=True,
        )
    atomic_write_with(out / "steps.csv", lambda tmp: pd.DataFrame(rows).to_csv(tmp, index=False))
    flat = [
        {"pair": r["pair"], "first": r["first"], "load_before": r["load_before"], "load_after": r["load_after"]}
        | {f"{side}_{k}": v for side in ("pods-bench", "trl") for k, v in r[side].items()}
        | {f"ratio_{k}": v for k, v in r["ratio"].items()}
        for r in pairs
    ]
    atomic_write_with(out / "pairs.csv", lambda tmp: pd.DataFrame(flat).to_csv(tmp, index=False))
    text = summary(pairs, args.steps)
    atomic_write_text(out / "summary.md", text)
    print("\n" + text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
