"""Inline evaluation shared by the training processes (pods_bench/evaluate.py `Share`): each process
samples and grades a contiguous slice of each benchmark, rank 0 merges the slices in the problems'
order and writes the record a single process would write from the same completions."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch
import yaml

from pods_bench.evaluate import Share, merge_shares, sample_share, score
from tests.test_logprobs import run_on_two_processes
from tests.test_multiprocess import ENV, two_process_command
from tests.tiny_runs import read_lines, tiny_run

# A stand-in engine whose completions depend only on the prompt and on which pass it is (its
# calls counted), never on the seed or on the other prompts of the call: the processes' slices then
# get exactly the completions a single process gets, and the records can be compared field by field.
STUB = """
import zlib
from pods_bench.engines.base import RolloutEngine, Rollouts


class StubEngine(RolloutEngine):
    def __init__(self, golds):
        self.golds = golds  # prompt -> gold answer
        self.calls = []  # (prompts, seed) of each generate call

    def generate(self, prompts, n, sampling):
        assert n == 1
        passes = len(self.calls)
        self.calls.append((list(prompts), sampling.seed))
        texts = []
        for p in prompts:
            kind, gold = (zlib.crc32(p.encode()) + passes) % 3, self.golds[p]
            texts.append(
                [f"<think>t</think><answer>{gold}</answer>", f"so {gold}", "<think>t</think><answer>-7</answer>"][kind]
            )
        ids = [[[1] * (len(t) % 7 + 1)] for t in texts]
        return Rollouts([[0] for _ in prompts], ids, [[t] for t in texts])

    def sync_weights(self, model):
        pass


def setup(n_problems, repeats):
    from pods_bench.config import config_from_dict
    from pods_bench.evaluate import Benchmark
    from pods_bench.rewards import RewardFunction
    from pods_bench.tasks import load_problems
    from tests.tiny_runs import tiny_run

    cfg = config_from_dict(
        tiny_run("unused", eval={"n_problems": n_problems, "repeats": repeats, "n_examples": n_problems})
    )
    problems = load_problems("arith", "test", limit=n_problems)
    benchmark = Benchmark("arith", problems, [p.question for p in problems])
    engine = StubEngine({p.question: p.gold for p in problems})
    return cfg, benchmark, engine, RewardFunction(cfg.reward)
"""

TWO_PROCESS_EVAL = (
    STUB
    + """
import json, sys
from pathlib import Path
import torch.distributed as dist
from pods_bench.evaluate import Share, evaluate_checkpoint

dist.init_process_group("gloo")
share = Share(dist.get_rank(), dist.get_world_size())
cfg, benchmark, engine, reward_fn = setup(int(sys.argv[2]), int(sys.argv[3]))
state = {"checkpoint": "step-000000", "step": 0, "train_time_s": 0.0}
records = evaluate_checkpoint(engine, [benchmark], cfg, reward_fn, state if share.main else None, share)
out = Path(sys.argv[1])
# a file per process: two processes printing to one pipe can interleave their lines
(out / f"calls-{share.rank}.json").write_text(json.dumps(engine.calls))
(out / f"records-{share.rank}.json").write_text(json.dumps(records))
dist.destroy_process_group()
"""
)


@pytest.mark.slow
@pytest.mark.parametrize("n_problems", [7, 1])
def test_two_processes_share_an_evaluation_and_rank_0_writes_the_single_process_record(tmp_path, n_problems):
    """7 problems: rank 0 takes 0-2, rank 1 takes 3-6, each in one call per pass with its own seed;
    the merged record (every problem an example, so every id and completion is in it, in order)
    equals the single process's field by field. 1 problem: rank 1's slice is empty."""
    repeats = 2
    run_on_two_processes(TWO_PROCESS_EVAL, tmp_path, str(tmp_path), str(n_problems), str(repeats))
    calls = [json.loads((tmp_path / f"calls-{rank}.json").read_text()) for rank in (0, 1)]
    records = [json.loads((tmp_path / f"records-{rank}.json").read_text()) for rank in (0, 1)]
    assert records[1] == []  # rank 0 alone has the records

    namespace: dict = {}
    exec(STUB, namespace)
    cfg, benchmark, engine, reward_fn = namespace["setup"](n_problems, repeats)
    with reward_fn:
        single = sample_share(engine, benchmark, cfg.eval, reward_fn, Share())
    prompts = benchmark.prompts
    cut = n_problems // 2  # Share.bounds: [n k / K, n (k + 1) / K)
    # each process sampled its own contiguous slice, once per pass, with the documented seeds
    share = Share(0, 2)
    for rank, (start, end) in enumerate([(0, cut), (cut, n_problems)]):
        expected = [[prompts[start:end], share.seed(cfg.eval.seed + r, rank)] for r in range(repeats)]
        assert calls[rank] == (expected if end > start else [])
    assert share.seed(cfg.eval.seed, 0) == cfg.eval.seed != share.seed(cfg.eval.seed, 1)

    (record,) = records[0]
    assert record["eval_processes"] == 2 and record["n_problems"] == n_problems
    assert [e["id"] for e in record["examples"]] == [p.id for p in benchmark.problems]
    # the record from the same completions by one process, field by field
    alone = score(benchmark, cfg.eval, single)
    shared = {k: v for k, v in record.items() if k not in ("checkpoint", "step", "train_time_s", "eval_time_s")}
    assert shared == {**alone, "eval_processes": 2}
    # the metrics are the means over the merged per-problem results (not vacuous: the passes differ)
    for r, graded in enumerate(single):
        correct = np.array([g.correct for g in graded])
        formatted = np.array([g.format_ok for g in graded])
        assert record["answer_acc"][r] == correct.mean() and record["format_acc"][r] == formatted.mean()
        assert record["both_acc"][r] == (correct & formatted).mean()
    if n_problems > 1:
        assert record["answer_acc"][0] != record["answer_acc"][1]
        assert 0 < record["both_acc"][0] < record["answer_acc"][0] < 1


def test_shares_cover_the_problems_once_in_order():
    for n in (0, 1, 5, 8, 1319):
        for world in (1, 2, 3, 8):
            bounds = [Share(rank, world).bounds(n) for rank in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            sizes = [end - start for start, end in bounds]
            assert max(sizes) - min(sizes) <= 1
    assert Share().gather("x") == ["x"] and Share().broadcast(3) == 3


def test_a_lost_or_misordered_slice_is_not_merged():
    parts = [[["a0", "a1"]], [["b0"]]]
    assert merge_shares(parts, 3) == [["a0", "a1", "b0"]]
    with pytest.raises(Exception, match="gathered"):
        merge_shares([[["a0", "a1"]], [[]]], 3)


@pytest.mark.slow
def test_a_two_process_run_writes_the_merged_evaluation_of_each_slice(tmp_path):
    """A real two-process run (gloo): the step-0 record is the merge of the two slices each sampled as
    the process that owned it samples it (its own generate call, its own seed) from the checkpoint's
    weights, recomputed here in one process, in the problems' order; not the one-process evaluation."""
    from pods_bench import checkpoint as ckpt
    from pods_bench.config import config_from_dict
    from pods_bench.engines import make_engine
    from pods_bench.evaluate import load_benchmarks
    from pods_bench.rewards import RewardFunction

    run_dir = tmp_path / "run"
    config = tmp_path / "train.yaml"
    settings = tiny_run(run_dir, budget={"max_steps": 1}, eval={"n_problems": 5, "n_examples": 5})
    config.write_text(yaml.safe_dump(settings))
    done = subprocess.run(two_process_command(config), capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_lines(run_dir / "eval.jsonl")
    assert [r["checkpoint"] for r in records] == ["step-000000", "step-000001"]
    assert all(r["eval_processes"] == 2 and r["n_problems"] == 5 for r in records)

    cfg = config_from_dict(settings)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the training processes ran (OMP_NUM_THREADS=1)
    try:
        model, tokenizer = ckpt.load_policy(cfg, run_dir / "checkpoints/step-000000")
        (benchmark,) = load_benchmarks(cfg, tokenizer)
        with make_engine(cfg, model, tokenizer) as engine, RewardFunction(cfg.reward) as reward_fn:
            parts = [sample_share(engine, benchmark, cfg.eval, reward_fn, Share(rank, 2)) for rank in (0, 1)]
            alone = sample_share(engine, benchmark, cfg.eval, reward_fn, Share())
    finally:
        torch.set_num_threads(threads)
    merged = score(benchmark, cfg.eval, merge_shares(parts, 5), processes=2)
    record = {k: v for k, v in records[0].items() if k in merged}
    assert [e["id"] for e in record["examples"]] == [p.id for p in benchmark.problems]
    assert record == merged
    # rank 1's slice was its own call with its own seed: one process sampling all five draws otherwise
    assert [g.text for g in alone[0][2:]] != [g.text for g in parts[1][0]]
