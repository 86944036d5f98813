"""pods-bench's GRPO step beside TRL's GRPOTrainer, on the same model, prompts, reward and settings
(`make bench-peer`; trl is the `bench` extra, not a dependency of pods-bench).

The smoke model (warm start), the smoke task's first training prompts rendered once and handed to
both, pods-bench's reward (math-verify in its grading pool) as TRL's reward function; 8 prompts x 16
completions, 32 new tokens, temperature 1, top-k/top-p off, beta 0, TRL loss_type "grpo" (= pods-bench's
"sequence" aggregation), bf16 and gradient checkpointing off, lr 1e-4, one thread budget for both.
The two trainers run in interleaved pairs (pods-bench, TRL, pods-bench, TRL, ...), so that a machine
that speeds up or slows down touches both alike; each run's first step is a warm-up and is dropped.

Phases, the same span on both sides:
    generation   tokenise, sample, decode, grade, advantages   (pods-bench: gen + reward + select;
                 TRL: _generate_and_score_completions)
    update       forward/backward, optimizer step, weight sync  (pods-bench: update + sync;
                 TRL: the rest of the optimizer step)

    python -m tests.benchmarks.peer_trl [--pairs 3] [--steps 15] [--out results/bench-peer]
prints the median seconds per phase of each side and their ratio (pods-bench / TRL), per pair and
overall, and writes the per-step times to <out>/steps.csv.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WARM_START = ROOT / "results" / "warm_start" / "arith-tiny"


def pods_bench_config(out: Path, steps: int):
    """The smoke experiment's GRPO arm, as `pods-bench profile` runs it (its training job's config,
    no evaluation, no checkpoints but the first and last), for `steps` steps."""
    from pods_bench.config import config_from_dict
    from pods_bench.planning.profile import arm_configs

    settings, overrides = arm_configs(ROOT / "config" / "smoke.yaml", out)["grpo_n16_m16"]
    settings = {**settings, "model": {**settings["model"], "name": str(WARM_START)}}
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

    def reward(prompts, completions, completion_ids, gold, **kwargs):
        texts = [
            tokenizer.decode([t for t in ids if t not in drop], skip_special_tokens=False) for ids in completion_ids
        ]
        return list(grader(texts, gold).total)

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
            times.append({"generation": self.generation, "update": total - self.generation})

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
        "step": statistics.median(s["generation"] + s["update"] for s in steps)
    }


def main(argv=None) -> int:
    import pandas as pd

    from pods_bench.io import atomic_write_with

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=15, help="timed steps per run (one more is run as a warm-up)")
    p.add_argument("--out", default=str(ROOT / "results" / "bench-peer"))
    args = p.parse_args(argv)
    if not (WARM_START / "config.json").is_file():
        from pods_bench.pretrain import PretrainConfig, pretrain

        pretrain(PretrainConfig(), WARM_START)
    out, rows, pairs = Path(args.out), [], []
    for pair in range(args.pairs):
        sides = {}
        for side, run in (("pods-bench", run_pods_bench), ("trl", run_trl)):
            steps = run(out / f"pair{pair}" / side, args.steps + 1)[1:]  # the first step warms up
            rows += [{"pair": pair, "side": side, "step": i + 2, **s} for i, s in enumerate(steps)]
            sides[side] = medians(steps)
        pairs.append(sides)
        ratio = {k: sides["pods-bench"][k] / sides["trl"][k] for k in sides["trl"]}
        print(
            f"pair {pair}: pods-bench {sides['pods-bench']['step']:.3f} s/step, TRL {sides['trl']['step']:.3f}; "
            + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items())
            + " (pods-bench / TRL)"
        )
    table = pd.DataFrame(rows)
    atomic_write_with(out / "steps.csv", lambda tmp: table.to_csv(tmp, index=False))
    print("\n| phase | pods-bench s | TRL s | pods-bench / TRL |\n| --- | --- | --- | --- |")
    for phase in ("generation", "update", "step"):
        ours = statistics.median(p["pods-bench"][phase] for p in pairs)
        theirs = statistics.median(p["trl"][phase] for p in pairs)
        print(f"| {phase} | {ours:.3f} | {theirs:.3f} | {ours / theirs:.3f} |")
    print(f"(medians over {args.pairs} interleaved pairs of {args.steps} timed steps; per step: {out / 'steps.csv'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
