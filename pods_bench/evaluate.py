"""Evaluation of checkpoints on held-out benchmarks.

Each checkpoint is scored on every benchmark of `cfg.eval`: the first `n_problems` problems of the
test split (a fixed set), `repeats` passes, each sampled with its own fixed seed (`eval.seed + r`, the
same for every checkpoint) at `eval.temperature` (0: greedy). Per pass: answer accuracy (math-verify),
format accuracy (the whole completion is `<think>...</think><answer>...</answer>`), both, and the mean
completion length in tokens. One record per checkpoint x benchmark goes to eval.jsonl.

Runs inline during training (the training clock is paused) or afterwards:
`pods-bench evaluate RUN_DIR` scores every checkpoint that lacks a record, so a workflow can
evaluate in parallel with training or after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pods_bench import checkpoint as ckpt
from pods_bench.checkpoint import prune, read_state
from pods_bench.config import config_from_dict
from pods_bench.engines import make_engine
from pods_bench.engines.base import RolloutEngine, SamplingConfig
from pods_bench.errors import PodsBenchError
from pods_bench.failpoints import failpoint
from pods_bench.io import append_jsonl, locked, read_jsonl
from pods_bench.rewards import RewardFunction, extract_answer, format_correct, gold_texts
from pods_bench.run_dir import EVAL_LOCK, EVAL_LOG, read_run_json
from pods_bench.tasks import load_problems
from pods_bench.tasks.prompts import filter_by_prompt_length, render_prompts


@dataclass
class Benchmark:
    name: str
    problems: list  # list[pods_bench.tasks.Problem]
    prompts: list[str]


def load_benchmarks(cfg, tokenizer) -> list[Benchmark]:
    benchmarks = []
    for name in cfg.eval.benchmarks:
        problems = load_problems(name, cfg.eval.split, data_dir=cfg.data_dir, limit=cfg.eval.n_problems)
        if not problems:
            raise PodsBenchError(f"benchmark {name!r} split {cfg.eval.split!r} has no rows")
        prompts = render_prompts(problems, tokenizer, cfg.task)
        if cfg.eval.max_prompt_tokens is not None:  # the paper scored only prompts of <= 512 tokens
            kept, _ = filter_by_prompt_length(prompts, tokenizer, cfg.eval.max_prompt_tokens)
            if not kept:
                raise PodsBenchError(
                    f"no prompt of benchmark {name!r} fits eval.max_prompt_tokens={cfg.eval.max_prompt_tokens}"
                )
            problems, prompts = [problems[i] for i in kept], [prompts[i] for i in kept]
        benchmarks.append(Benchmark(name, problems, prompts))
    return benchmarks


def evaluate_benchmark(engine: RolloutEngine, benchmark: Benchmark, eval_cfg, reward_fn) -> dict:
    """Metrics of the engine's current policy on one benchmark, one list entry per repeat."""
    golds = gold_texts(benchmark.problems, reward_fn.config.grading)
    metrics: dict[str, list[float]] = {"answer_acc": [], "format_acc": [], "both_acc": [], "mean_length": []}
    examples = []
    for repeat in range(eval_cfg.repeats):
        sampling = SamplingConfig(
            temperature=eval_cfg.temperature,
            top_p=eval_cfg.top_p,
            top_k=eval_cfg.top_k,
            min_p=eval_cfg.min_p,
            repetition_penalty=eval_cfg.repetition_penalty,
            max_new_tokens=eval_cfg.max_new_tokens,
            seed=eval_cfg.seed + repeat,
        )
        rollouts = engine.generate(benchmark.prompts, 1, sampling)
        texts = [group[0] for group in rollouts.completion_text]
        correct = reward_fn(texts, golds).correctness > 0
        formatted = np.array([format_correct(t) for t in texts])
        metrics["answer_acc"].append(float(correct.mean()))
        metrics["format_acc"].append(float(formatted.mean()))
        metrics["both_acc"].append(float((correct & formatted).mean()))
        metrics["mean_length"].append(float(np.mean([len(group[0]) for group in rollouts.completion_ids])))
        if repeat == 0:
            examples = [
                {
                    "id": p.id,
                    "question": p.question,
                    "gold": p.gold,
                    "completion": text,
                    "extracted": extract_answer(text),
                    "correct": bool(ok),
                    "format_ok": bool(fmt),
                }
                for p, text, ok, fmt, _ in zip(
                    benchmark.problems, texts, correct, formatted, range(eval_cfg.n_examples)
                )
            ]
    return {
        "benchmark": benchmark.name,
        "split": eval_cfg.split,
        "n_problems": len(benchmark.problems),
        "repeats": eval_cfg.repeats,
        "temperature": eval_cfg.temperature,
        **metrics,
        "examples": examples,
    }


def evaluate_checkpoint(engine, benchmarks: list[Benchmark], cfg, reward_fn, state: dict) -> list[dict]:
    """eval.jsonl records of the policy the engine samples from, saved as checkpoint `state`."""
    failpoint("eval")
    records = []
    for benchmark in benchmarks:
        started = time.perf_counter()
        metrics = evaluate_benchmark(engine, benchmark, cfg.eval, reward_fn)
        records.append(
            {
                "checkpoint": state["checkpoint"],
                "step": state["step"],
                "train_time_s": state["train_time_s"],
                **metrics,
                "eval_time_s": time.perf_counter() - started,
            }
        )
    return records


def evaluated(run_dir: str | Path) -> dict[str, set[str]]:
    """checkpoint name -> benchmarks it already has records for."""
    done: dict[str, set[str]] = {}
    for r in read_jsonl(Path(run_dir) / EVAL_LOG, drop_torn_tail=True):
        done.setdefault(r["checkpoint"], set()).add(r["benchmark"])
    return done


def append_eval_records(run_dir: str | Path, records: list[dict]) -> int:
    """Append the records whose (checkpoint, benchmark) has none yet; returns how many. Checked and
    written under the run's eval lock, so that two evaluators of one run (the trainer inline and
    `pods-bench evaluate`, or two of the latter) never duplicate a record."""
    run_dir = Path(run_dir)
    with locked(run_dir / EVAL_LOCK):
        done = evaluated(run_dir)
        new = [r for r in records if r["benchmark"] not in done.get(r["checkpoint"], set())]
        if new:
            append_jsonl(run_dir / EVAL_LOG, new)
    return len(new)


def evaluate_missing(
    run_dir: str | Path, checkpoint: Path, engine, benchmarks: list[Benchmark], cfg, reward_fn
) -> int:
    """Evaluate the policy the engine samples from, saved as `checkpoint`, on the benchmarks that
    checkpoint has no record for yet (after a crash in the middle of writing its records, only the
    rest), append the records and prune if asked. Returns the number of records written."""
    done = evaluated(run_dir).get(checkpoint.name, set())
    missing = [b for b in benchmarks if b.name not in done]
    if not missing:
        return 0
    records = evaluate_checkpoint(engine, missing, cfg, reward_fn, read_state(checkpoint))
    written = append_eval_records(run_dir, records)
    prune_if_asked(run_dir, cfg)
    return written


def fully_evaluated(run_dir: str | Path, benchmarks: list[str]) -> set[str]:
    return {name for name, done in evaluated(run_dir).items() if set(benchmarks) <= done}


def evaluate_run(run_dir: str | Path, overrides: list[str] = ()) -> int:
    """`pods-bench evaluate RUN_DIR`: score every checkpoint lacking a record; returns the number of
    records written. `overrides` (`eval.n_problems=100`, ...) apply to the run's recorded config."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar for every checkpoint in the job log
    run_dir = Path(run_dir)
    cfg = config_from_dict(read_run_json(run_dir)["config"], overrides)
    checkpoints = ckpt.list_checkpoints(run_dir)
    if not checkpoints:
        raise PodsBenchError(f"run folder {run_dir} has no complete checkpoint in {run_dir / ckpt.CHECKPOINTS}")
    complete = fully_evaluated(run_dir, cfg.eval.benchmarks)
    todo = [c for c in checkpoints if c.name not in complete]
    device = "cuda" if cfg.device != "cpu" and torch.cuda.is_available() else "cpu"
    engine = benchmarks = None
    written = 0
    with RewardFunction(cfg.reward) as reward_fn:
        try:
            for checkpoint in todo:
                model, tokenizer = ckpt.load_policy(cfg, checkpoint)
                model.to(device)
                if engine is None:
                    benchmarks = load_benchmarks(cfg, tokenizer)
                    engine = make_engine(cfg, model, tokenizer)
                else:
                    engine.sync_weights(model)
                written += evaluate_missing(run_dir, checkpoint, engine, benchmarks, cfg, reward_fn)
        finally:
            if engine is not None:
                engine.close()
    prune_if_asked(run_dir, cfg)
    return written


def prune_if_asked(run_dir: Path, cfg) -> None:
    """eval.keep_checkpoints=last: delete fully evaluated checkpoints but the newest."""
    if cfg.eval.keep_checkpoints == "last":
        prune(run_dir, fully_evaluated(run_dir, cfg.eval.benchmarks))
