"""Evaluation of checkpoints on held-out benchmarks.

Each checkpoint is scored on every benchmark of `cfg.eval`: the first `n_problems` problems of the
test split (a fixed set), `repeats` passes, each sampled with its own fixed seed (`eval.seed + r`, the
same for every checkpoint) at `eval.temperature` (0: greedy). Per pass: answer accuracy (math-verify),
format accuracy (the whole completion is `<think>...</think><answer>...</answer>`), both, and the mean
completion length in tokens. One record per checkpoint x benchmark goes to eval.jsonl.

Runs inline during training (the training clock is paused) or afterwards:
`pods-bench evaluate RUN_DIR` scores every checkpoint that lacks a record, so a workflow can
evaluate in parallel with training or after it.

Inline with K > 1 training processes the evaluation is shared (`Share`): process k samples and
grades the contiguous slice [n k / K, n (k + 1) / K) of each benchmark's n problems on its own
engine (HF generate on the gathered whole weights, or its own vLLM engine), and rank 0 gathers the
per-problem results, puts them back in the problems' order and computes the record from them with
the very code a single process uses: given the same completions the record is the one a single
process would write. Slice k of pass r samples with seed `eval.seed + r` for k = 0 and
`derived_seed(eval.seed + r, k)` for k > 0, so the slices draw unrelated random streams and one
process (K = 1, `pods-bench evaluate`) samples exactly as before. What a record depends on, beyond
the weights and the eval settings: the number of processes K (the slices' bounds and seeds; recorded
as `eval_processes`) and, within a slice, how the engine batches it (HF generate: a seeded call's one
random stream is drawn batch after batch of `engine.max_batch` rows, so a row's sampled tokens
depend on the rows generated with it and before it; and the left padding and batch shape change the
logits' rounding, so even greedy completions may differ from a single process's in rare near-ties;
vLLM: its scheduler's batches). With sampling (temperature > 0) a K-process record and a
one-process record of the same checkpoint therefore differ by sampling noise, not systematically.
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
from pods_bench.sampling import derived_seed
from pods_bench.sharding import broadcast_object
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


@dataclass(frozen=True)
class Share:
    """This process's part of an evaluation shared by `world` processes of a torch.distributed group:
    the slice of each benchmark it samples and grades, the seed it samples it with, and the
    collectives that bring the parts to rank 0 (which alone merges them and writes the records).
    `Share()` is one process evaluating everything, with no collective call."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def bounds(self, n: int, rank: int | None = None) -> tuple[int, int]:
        """The contiguous slice [start, end) of n problems process `rank` (default: this one) takes."""
        rank = self.rank if rank is None else rank
        return n * rank // self.world, n * (rank + 1) // self.world

    def seed(self, pass_seed: int, rank: int | None = None) -> int:
        """The seed process `rank`'s slice is sampled with in the pass seeded `pass_seed`: that seed
        itself for the first slice (so one process samples as it always has), unrelated ones for the rest."""
        rank = self.rank if rank is None else rank
        return pass_seed if rank == 0 else derived_seed(pass_seed, rank)

    def gather(self, part):
        """Every process's `part`, in rank order, on rank 0 (None elsewhere). A collective call."""
        if self.world == 1:
            return [part]
        import torch.distributed as dist

        parts = [None] * self.world if self.main else None
        dist.gather_object(part, parts, dst=0)
        return parts

    def broadcast(self, value):
        """Rank 0's `value` on every process. A collective call."""
        return value if self.world == 1 else broadcast_object(value)


@dataclass(frozen=True)
class Graded:
    """One problem's completion in one pass, graded."""

    text: str
    correct: bool
    format_ok: bool
    length: int  # completion tokens


def sampling_of(eval_cfg, seed: int) -> SamplingConfig:
    return SamplingConfig(
        temperature=eval_cfg.temperature,
        top_p=eval_cfg.top_p,
        top_k=eval_cfg.top_k,
        min_p=eval_cfg.min_p,
        repetition_penalty=eval_cfg.repetition_penalty,
        max_new_tokens=eval_cfg.max_new_tokens,
        seed=seed,
    )


def sample_and_grade(engine: RolloutEngine, prompts: list[str], golds: list[str], sampling, reward_fn) -> list[Graded]:
    """One completion per prompt, graded; in the prompts' order."""
    if not prompts:  # a process whose slice is empty (fewer problems than processes)
        return []
    rollouts = engine.generate(prompts, 1, sampling)
    texts = [group[0] for group in rollouts.completion_text]
    correct = reward_fn(texts, golds).correctness > 0
    return [
        Graded(text, bool(ok), bool(format_correct(text)), len(group[0]))
        for text, ok, group in zip(texts, correct, rollouts.completion_ids)
    ]


def sample_share(engine, benchmark: Benchmark, eval_cfg, reward_fn, share: Share) -> list[list[Graded]]:
    """This process's slice of the benchmark, graded, one list per pass."""
    start, end = share.bounds(len(benchmark.problems))
    golds = gold_texts(benchmark.problems[start:end], reward_fn.config.grading)
    return [
        sample_and_grade(
            engine,
            benchmark.prompts[start:end],
            golds,
            sampling_of(eval_cfg, share.seed(eval_cfg.seed + r)),
            reward_fn,
        )
        for r in range(eval_cfg.repeats)
    ]


def merge_shares(parts: list[list[list[Graded]]], n_problems: int) -> list[list[Graded]]:
    """The processes' slices (in rank order) put together, one list per pass in the problems' order."""
    passes = [[graded for part in parts for graded in part[r]] for r in range(len(parts[0]))]
    if any(len(graded) != n_problems for graded in passes):
        raise PodsBenchError(
            f"a shared evaluation gathered {[len(g) for g in passes]} results of {n_problems} problems"
        )
    return passes


def score(benchmark: Benchmark, eval_cfg, passes: list[list[Graded]], processes: int = 1) -> dict:
    """The record's metrics and examples from every problem's graded completion (problem order), one
    list per pass: one list entry per repeat."""
    metrics: dict[str, list[float]] = {"answer_acc": [], "format_acc": [], "both_acc": [], "mean_length": []}
    for graded in passes:
        correct = np.array([g.correct for g in graded])
        formatted = np.array([g.format_ok for g in graded])
        metrics["answer_acc"].append(float(correct.mean()))
        metrics["format_acc"].append(float(formatted.mean()))
        metrics["both_acc"].append(float((correct & formatted).mean()))
        metrics["mean_length"].append(float(np.mean([g.length for g in graded])))
    examples = [
        {
            "id": p.id,
            "question": p.question,
            "gold": p.gold,
            "completion": g.text,
            "extracted": extract_answer(g.text),
            "correct": g.correct,
            "format_ok": g.format_ok,
        }
        for p, g, _ in zip(benchmark.problems, passes[0], range(eval_cfg.n_examples))
    ]
    return {
        "benchmark": benchmark.name,
        "split": eval_cfg.split,
        "n_problems": len(benchmark.problems),
        "repeats": eval_cfg.repeats,
        "temperature": eval_cfg.temperature,
        **metrics,
        "examples": examples,
        "eval_processes": processes,
    }


def evaluate_benchmark(
    engine: RolloutEngine, benchmark: Benchmark, eval_cfg, reward_fn, share: Share = Share()
) -> dict | None:
    """Metrics of the engine's current policy on one benchmark, one list entry per repeat; shared by
    the processes of `share` (a collective call then), the record on rank 0 (None elsewhere)."""
    parts = share.gather(sample_share(engine, benchmark, eval_cfg, reward_fn, share))
    if not share.main:
        return None
    return score(benchmark, eval_cfg, merge_shares(parts, len(benchmark.problems)), share.world)


def evaluate_checkpoint(
    engine, benchmarks: list[Benchmark], cfg, reward_fn, state: dict | None, share: Share = Share()
) -> list[dict]:
    """eval.jsonl records of the policy the engine samples from, saved as checkpoint `state`: on rank
    0 of `share` (every process calls it; the others get an empty list and need no state)."""
    failpoint("eval")
    records = []
    for benchmark in benchmarks:
        started = time.perf_counter()
        metrics = evaluate_benchmark(engine, benchmark, cfg.eval, reward_fn, share)
        if share.main:
            records.append(
                {
                    "checkpoint": state["checkpoint"],
                    "step": state["step"],
                    "train_time_s": state["train_time_s"],
                    **metrics,
                    "eval_time_s": time.perf_counter() - started,  # on rank 0: until the last slice arrived
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
    run_dir: str | Path, checkpoint: Path, engine, benchmarks: list[Benchmark], cfg, reward_fn, share: Share = Share()
) -> int:
    """Evaluate the policy the engine samples from, saved as `checkpoint`, on the benchmarks that
    checkpoint has no record for yet (after a crash in the middle of writing its records, only the
    rest), append the records and prune if asked. Returns the number of records written (0 on ranks
    other than 0). Shared by the processes of `share`: every one calls it, rank 0 decides what is
    missing and alone writes."""
    done = evaluated(run_dir).get(checkpoint.name, set()) if share.main else None
    missing = share.broadcast([b.name for b in benchmarks if b.name not in done] if share.main else None)
    if not missing:
        return 0
    todo = [b for b in benchmarks if b.name in missing]
    state = read_state(checkpoint) if share.main else None
    records = evaluate_checkpoint(engine, todo, cfg, reward_fn, state, share)
    if not share.main:
        return 0
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
