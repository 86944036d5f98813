"""pods-bench's GRPO step beside TRL's GRPOTrainer, on the same model, prompts, reward and settings
(`make bench-peer`; trl is the `bench` extra, not a dependency of pods-bench).

Two workloads (--workload), each an experiment config's GRPO arm as its training job would run it:
    smoke    the smoke model (warm start, a character tokenizer), full fine-tuning; 8 prompts x 16
             completions, 32 new tokens, temperature 1, lr 1e-4 (config/smoke.yaml)
    smollm2  SmolLM2-135M-Instruct (a BPE tokenizer, a chat template, completions of varying length:
             padding matters) with LoRA r 64 on every linear layer, as TRL gets it through peft; 4
             prompts x 8 completions, 16 new tokens, temperature 0.9 (config/smollm2_arith.yaml)
Both sides get the prompts pods-bench's trainer draws (in its seeded order) rendered once, pods-bench's
reward (math-verify in its grading pool) as TRL's reward function, top-k/top-p off, beta 0, TRL loss_type "grpo" (=
pods-bench's "sequence" aggregation), bf16 and gradient checkpointing off, one thread budget.
The two trainers run in interleaved pairs whose order alternates (pods-bench first in even pairs, TRL
first in odd ones), so that a machine that speeds up or slows down, or a first-run advantage, touches
both alike; each run's first step is a warm-up and is dropped.

Phases, the same span on both sides:
    generation   tokenise, sample, decode, grade, advantages   (pods-bench: gen + reward + select;
                 TRL: _generate_and_score_completions)
    update       forward/backward, optimizer step, weight sync  (pods-bench: update + sync;
                 TRL: the rest of the optimizer step)
`--arm` picks another of the config's arms; a PODS arm (m < n) runs pods-bench's PODS on one side and
TRL with pods-bench's integration (pods_bench.integrations.trl.PODSGRPOTrainer: n sampled, m kept by
the arm's rule, advantages over the m) on the other: PODS in TRL beside pods-bench's PODS.
"Same work" is measured, not assumed: each side's mean completion length and mean reward over its
timed steps (pods-bench from its step log, TRL from the completions its reward function grades).

    python -m tests.benchmarks.peer_trl [--workload smoke|smollm2] [--arm ARM] [--pairs 8] [--steps 15] [--out DIR]
                                        [--model DIR]
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("generation", "update", "step")


@dataclass(frozen=True)
class Workload:
    """An experiment config's arm that both trainers run; `model` replaces the config's model (the
    smoke warm start's folder, from the cwd), None keeps it."""

    config: str
    arm: str
    model: Path | None = None


WORKLOADS = {
    "smoke": Workload("smoke.yaml", "grpo_n16_m16", Path("results") / "warm_start" / "arith-tiny"),
    "smollm2": Workload("smollm2_arith.yaml", "grpo_n8_m8"),
}


def pods_bench_config(workload: Workload, out: Path, steps: int):
    """The workload's arm as `pods-bench profile` runs it (its training job's config, no evaluation,
    no checkpoints but the first and last), for `steps` steps."""
    from pods_bench.config import config_from_dict
    from pods_bench.errors import PodsBenchError
    from pods_bench.planning.profile import arm_configs

    arms = arm_configs(ROOT / "config" / workload.config, out, check_model=False)
    if workload.arm not in arms:
        raise PodsBenchError(
            f"--arm: no arm {workload.arm!r} in config/{workload.config}; choose from {', '.join(arms)}"
        )
    settings, overrides, _ = arms[workload.arm]
    if workload.model is not None:
        settings = {**settings, "model": {**settings["model"], "name": str(workload.model.resolve())}}
    return config_from_dict(settings, [*overrides, f"budget.max_steps={steps}"])


def run_pods_bench(workload: Workload, out: Path, steps: int) -> list[dict]:
    from pods_bench.io import read_jsonl
    from pods_bench.train import train

    cfg = pods_bench_config(workload, out, steps)
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


def run_trl(workload: Workload, out: Path, steps: int) -> list[dict]:
    """TRL's GRPOTrainer on the same model, prompts and reward, its phases timed from outside."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pods_bench.model_sources import resolve
    from pods_bench.rewards import RewardFunction, gold_texts
    from pods_bench.sampling import PromptStream, load_training_prompts

    cfg = pods_bench_config(workload, out / "unused", steps)
    folder = resolve(cfg.model.name).path  # a GGUF source's converted folder, as pods-bench loads it
    tokenizer = AutoTokenizer.from_pretrained(folder)  # the exact tokenizer pods-bench loads
    tokenizer.padding_side = "left"
    problems, prompts, _ = load_training_prompts(cfg.task, cfg.data_dir, tokenizer)
    # the prompts pods-bench's trainer draws, in its order (a seeded permutation, not the file's order),
    # so that both sides sample the same problems at every step (TRL reads the dataset in order)
    order = PromptStream(len(problems), cfg.seed).take(0, cfg.prompts_per_step * steps)
    golds = gold_texts([problems[i] for i in order], cfg.reward.grading)
    dataset = Dataset.from_dict({"prompt": [prompts[i] for i in order], "gold": golds})
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
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, cfg.model.dtype))
    peft_config = None
    if cfg.lora.enabled:  # pods-bench's adapters (pods_bench/checkpoint.py), as TRL takes them
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=list(cfg.lora.target_modules),
            task_type="CAUSAL_LM",
        )
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
    pods = {}
    if cfg.selection.m < cfg.selection.n:  # PODS in TRL: pods-bench's integration, the arm's m and rule
        from pods_bench.integrations.trl import PODSGRPOTrainer as Trainer

        pods = {"pods_m": cfg.selection.m, "pods_rule": cfg.selection.rule}
    else:
        Trainer = GRPOTrainer
    trainer = Trainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config,
        **pods,
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


def phase_ratios(ours: dict[str, float], theirs: dict[str, float]) -> dict[str, float]:
    """pods-bench's seconds over TRL's, per phase: below 1 where pods-bench is faster."""
    return {k: ours[k] / theirs[k] for k in PHASES}


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

    from pods_bench.errors import PodsBenchError
    from pods_bench.io import atomic_write_text, atomic_write_with

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="smoke")
    p.add_argument("--arm", help="another arm of the workload's config (default: its GRPO arm)")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--steps", type=int, default=15, help="timed steps per run (one more is run as a warm-up)")
    p.add_argument("--out", help="default: results/bench-peer (smoke), results/bench-peer-<workload> (others)")
    p.add_argument(
        "--model", help="smoke: the warm-started model (default results/warm_start/arith-tiny, built if missing)"
    )
    args = p.parse_args(argv)
    workload = WORKLOADS[args.workload]
    if args.arm:
        workload = Workload(workload.config, args.arm, workload.model)
    if args.workload == "smoke":
        workload = Workload(workload.config, workload.arm, Path(args.model) if args.model else workload.model)
    elif args.model:
        p.error(f"--model applies to the smoke workload only (the {args.workload} workload's model is its config's)")
    default_out = "bench-peer" if args.workload == "smoke" else f"bench-peer-{args.workload}"
    out = Path(args.out or Path("results") / (default_out + (f"-{args.arm}" if args.arm else "")))
    try:
        cfg = pods_bench_config(workload, out / "check", 1)  # a bad --arm fails here, before any run
    except PodsBenchError as e:
        p.error(str(e))
    if workload.model is not None and not (workload.model / "config.json").is_file():
        from pods_bench.pretrain import PretrainConfig, pretrain

        pretrain(PretrainConfig(), workload.model)
    rows, pairs = [], []
    runners = {"pods-bench": run_pods_bench, "trl": run_trl}
    for pair in range(args.pairs):
        order = ("pods-bench", "trl") if pair % 2 == 0 else ("trl", "pods-bench")
        record = {"pair": pair, "first": order[0], "load_before": os.getloadavg()[0]}
        for side in order:
            steps = runners[side](workload, out / f"pair{pair}" / side, args.steps + 1)[1:]  # the first step warms up
            rows += [{"pair": pair, "side": side, "step": i + 2, **s} for i, s in enumerate(steps)]
            record[side] = medians(steps)
        record["load_after"] = os.getloadavg()[0]
        record["ratio"] = phase_ratios(record["pods-bench"], record["trl"])
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
    trl_side = "PODSGRPOTrainer (PODS in TRL)" if cfg.selection.m < cfg.selection.n else "GRPOTrainer"
    text = (
        f"Workload: {args.workload} ({workload.config}, arm {workload.arm}: n {cfg.selection.n}, m "
        f"{cfg.selection.m}, rule {cfg.selection.rule}; TRL's side: {trl_side}).\n\n" + summary(pairs, args.steps)
    )
    atomic_write_text(out / "summary.md", text)
    print("\n" + text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
