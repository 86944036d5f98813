"""Kill -9 fault injection: a training run killed with SIGKILL at 10 moments and resumed each time by
rerunning the same command ends with the same train_log.jsonl and eval.jsonl as a run never killed.

The kills come from `pods_bench.failpoints` (PODS_BENCH_KILL_AT): the process sends itself SIGKILL at
the k-th generation, update, checkpoint write, evaluation or log append, at once or after a random
delay, i.e. somewhere inside the work that follows. Two kills of each kind, points, hits and delays
drawn from a seeded generator.

Compared exactly: every field of every record except the wall-clock measurements (TIMING_FIELDS:
train_time_s, time_*_s, eval_time_s), which differ between any two runs. Everything else (rewards,
losses, gradient norms, token counts, accuracies, example completions, the final weights' hash) is a
deterministic function of config and seed on CPU: sampling seeds derive from (seed, step), the RNG
states are restored from the checkpoint, evaluation samples with fixed seeds.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.processes import running_beside, session_processes, still_running_after
from tests.tiny_runs import read_lines, tiny_run, without_timings

pytestmark = pytest.mark.slow

# 10 kills: two in each phase; of the two mid-line kills one tears train_log.jsonl, one eval.jsonl
KILLS = {"gen": 2, "update": 2, "checkpoint": 2, "eval": 2, "append_train_log": 1, "append_eval": 1}
SEED = 20260430
# Long enough that no planned kill finds the run already finished (a killed attempt gets up to two
# checkpoints, four steps, further: 10 x 4 = 40).
STEPS = 40
SETTINGS = dict(
    budget={"max_steps": STEPS, "checkpoint_every_s": 3600, "checkpoint_every_steps": 2},
    eval={"benchmarks": ["arith", "gsm8k"], "n_problems": 4, "max_new_tokens": 12, "n_examples": 1, "inline": True},
    # a real grading process, which must not outlive a killed trainer; math-verify's timeouts are
    # wall-clock, 10 s so that a busy machine does not make one run's grading differ from the other's
    reward={"workers": 1, "timeout_s": 10},
)


def kill_plan(seed: int) -> list[str]:
    """PODS_BENCH_KILL_AT values in random order, each at the point's first or second pass; phase
    kills wait a random 0-150 ms (a tiny-model phase lasts ~10-300 ms), except one checkpoint kill,
    which strikes as soon as the temporary folder exists (a checkpoint write takes only ~50 ms
    here, so a delayed kill can miss it); append kills land mid-line."""
    rng = random.Random(seed)
    points = [p for p, count in KILLS.items() for _ in range(count)]
    rng.shuffle(points)
    plan, immediate_checkpoint = [], True
    for p in points:
        spec = f"{p}:{rng.randint(1, 2)}"
        if p == "checkpoint" and immediate_checkpoint:
            spec, immediate_checkpoint = spec + ":0", False
        elif not p.startswith("append"):
            spec += f":{rng.randint(0, 150)}"
        plan.append(spec)
    return plan


def start_training(config_path, env_extra: dict | None = None, output=None) -> subprocess.Popen:
    """`pods-bench train` on one torch thread; its output piped, or written to the open file `output`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "pods_bench", "train", "--config", str(config_path), "--no-progress"],
        env=env,
        stdout=output or subprocess.PIPE,
        stderr=subprocess.STDOUT if output else subprocess.PIPE,
        text=True,
        start_new_session=True,  # the trainer and its grading processes share a session id we can find
    )


@contextmanager
def straight_run_beside(config_path, log_path):
    """The never-killed run, trained while the block kills and resumes its twin (each on one torch
    thread, beside the other chains of `kill_chains`): finished and checked when the block ends,
    killed if it fails."""
    with open(log_path, "w") as output, running_beside(start_training(config_path, output=output)) as proc:
        yield
    assert proc.returncode == 0, Path(log_path).read_text()[-3000:]


def write_config(path, run_dir, data_dir):
    cfg = tiny_run(run_dir, data_dir=str(data_dir), **SETTINGS)
    path.write_text(yaml.safe_dump(cfg))
    return path


def aftermath(run_dir) -> dict:
    """What a kill left behind: torn last lines and temporary checkpoint folders."""
    torn = [
        log
        for log in ("train_log.jsonl", "eval.jsonl")
        if (run_dir / log).exists() and not (run_dir / log).read_bytes().endswith(b"\n")
    ]
    partial = [p.name for p in (run_dir / "checkpoints").glob(".tmp-*")] if (run_dir / "checkpoints").is_dir() else []
    return {"torn": torn, "partial_checkpoints": partial}


def keys(records: list[dict], fields: tuple[str, ...]) -> list[tuple]:
    return [tuple(r[f] for f in fields) for r in records]


def kill_at_ten_moments(folder: Path, data_dir) -> dict:
    """The run in folder/killed killed at every moment of `kill_plan` and resumed each time, a run
    never killed in folder/straight beside it: what each kill left behind."""
    straight_cfg = write_config(folder / "straight.yaml", folder / "straight", data_dir)
    killed_cfg = write_config(folder / "killed.yaml", folder / "killed", data_dir)
    kills = []
    with straight_run_beside(straight_cfg, folder / "straight.log"):
        for spec in kill_plan(SEED):
            proc = start_training(killed_cfg, {"PODS_BENCH_KILL_AT": spec})
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == -signal.SIGKILL, (
                f"{spec}: the run was not killed (exit {proc.returncode}); {err[-2000:]}"
            )
            orphans = still_running_after(lambda: session_processes(proc.pid), 20.0)
            assert not orphans, f"{spec}: processes outlived the killed trainer: {[p.cmdline() for p in orphans]}"
            kills.append({"spec": spec, **aftermath(folder / "killed")})
        proc = start_training(killed_cfg)  # the final, uninterrupted resume
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    return {"folder": folder, "kills": kills}


def test_kill_9_at_ten_moments_loses_and_duplicates_nothing(kill_chains):
    chain = kill_chains["ten_moments"].result()
    for kill in chain["kills"]:
        print(
            f"\n  {kill['spec']:>16}: torn lines {kill['torn']}, partial checkpoints {kill['partial_checkpoints']}",
            end="",
        )
    landed = [kill["spec"] for kill in chain["kills"]]
    torn = sum(bool(kill["torn"]) for kill in chain["kills"])
    partial = sum(bool(kill["partial_checkpoints"]) for kill in chain["kills"])
    # the dangerous states were really produced (and then repaired by the resumes)
    assert torn >= 2 and partial >= 1, (torn, partial)

    straight, killed = chain["folder"] / "straight", chain["folder"] / "killed"
    steps_a, steps_b = read_lines(straight / "train_log.jsonl"), read_lines(killed / "train_log.jsonl")
    evals_a, evals_b = read_lines(straight / "eval.jsonl"), read_lines(killed / "eval.jsonl")
    step_keys, eval_keys = keys(steps_b, ("step",)), keys(evals_b, ("checkpoint", "benchmark"))
    lost = len(set(keys(steps_a, ("step",))) - set(step_keys)) + len(
        set(keys(evals_a, ("checkpoint", "benchmark"))) - set(eval_keys)
    )
    duplicated = sum(c - 1 for c in Counter(step_keys).values()) + sum(c - 1 for c in Counter(eval_keys).values())
    info = json.loads((killed / "run.json").read_text())
    print(
        f"\nkill -9 fault injection: {len(landed)} kills ({', '.join(landed)}), {len(info['resumed'])} resumes, "
        f"{len(steps_b)} steps and {len(evals_b)} eval records; {torn} kills left a torn log line, {partial} a partial "
        f"checkpoint; lost {lost}, duplicated {duplicated}"
    )

    assert [r["step"] for r in steps_a] == list(range(1, STEPS + 1))
    assert (lost, duplicated) == (0, 0)
    assert without_timings(steps_b) == without_timings(steps_a)
    assert without_timings(evals_b) == without_timings(evals_a)  # same records, same order
    assert len(evals_a) == 2 * (STEPS // 2 + 1)  # checkpoints at steps 0, 2, 4, ... on two benchmarks

    assert info["status"] == "finished" and len(info["resumed"]) == len(landed)
    sha = lambda run: json.loads((run / f"checkpoints/step-{STEPS:06d}/state.json").read_text())["params_sha256"]
    assert sha(killed) == sha(straight)
    names = lambda run: sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names(killed) == names(straight)  # no temporary checkpoint folders left
    # no temporary files left (the lock files stay: the kernel released their locks with the process)
    assert not [p.name for p in killed.iterdir() if p.name.startswith(".") and p.suffix != ".lock"]


# --- the allocation strategies' per-prompt state -------------------------------------------------

# hits count within each attempt; checkpoints every 2 steps. Pilot-Commit, whose state crosses steps: killed
# in step 4, in writing step 6's checkpoint and in step 7, so the three resumes start from steps 2, 4 and 6,
# each with a filled state. VIGOR and HORA keep no state between steps (a kill in a checkpoint write or an
# update resumes them as any run: the ten moments above) but generate a step in rounds: killed 250 ms
# (VIGOR, 64 rollouts) or 60 ms (HORA, 32) into step 4's generation, the kill lands inside its rounds
KILLS_OF = {
    "pilot_commit": ["gen:4:80", "checkpoint:2:0", "update:3:50"],
    "vigor": ["gen:4:250"],
    "hora": ["gen:4:60"],
}
RESUMED_FROM = {
    "pilot_commit": ["step-000002", "step-000004", "step-000006"],
    "vigor": ["step-000002"],
    "hora": ["step-000002"],
}
STRATEGY_SETTINGS = {
    "pilot_commit": {
        "selection": {"rule": "max_variance", "n": 8, "m": 4},
        "allocation": {"pilot_commit": {"pilot_prompts": 6, "pilot_rollouts": 4}},
    },
    # groups of different sizes, every rollout trained (VIGOR: 8 prompts end with 2, 2, 2, 2, 6, 6, 14, 30)
    "vigor": {"prompts_per_step": 8, "selection": {"rule": "all", "n": 8, "m": 8}},
    "hora": {"prompts_per_step": 4, "selection": {"rule": "all", "n": 8, "m": 8}},
}


def kill_and_resume(strategy: str, folder: Path, data_dir, smoke_model_dir) -> Path:
    """A straight run of `strategy` in folder/straight, and its twin in folder/killed killed at
    KILLS_OF[strategy] and resumed after each (the straight run beside the kills); `folder`."""
    paths = {}
    for name in ("straight", "killed"):
        cfg = tiny_run(
            folder / name,
            data_dir=str(data_dir),
            model={"name": str(smoke_model_dir)},
            task={"name": "arith", "system_prompt": "", "limit": 24},
            sampling={"temperature": 1.0, "max_new_tokens": 24},
            optim={"lr": 1e-4, "micro_batch_size": 32},
            budget={"max_steps": 10, "checkpoint_every_s": 3600, "checkpoint_every_steps": 2},
            eval={"inline": False},
            reward={"workers": 1, "timeout_s": 10},
            **STRATEGY_SETTINGS[strategy],
        )
        cfg.setdefault("allocation", {})["strategy"] = strategy
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(cfg))

    with straight_run_beside(paths["straight"], folder / "straight.log"):
        for spec in KILLS_OF[strategy]:
            proc = start_training(paths["killed"], {"PODS_BENCH_KILL_AT": spec})
            _, err = proc.communicate(timeout=900)
            assert proc.returncode == -signal.SIGKILL, (
                f"{spec}: the run was not killed (exit {proc.returncode}); {err[-2000:]}"
            )
        proc = start_training(paths["killed"])
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
    return folder


@pytest.fixture(scope="module")
def kill_chains(tmp_path_factory, data_dir, smoke_model_dir) -> dict[str, Future]:
    """Every kill -9 chain of this file with its straight twin, two chains at a time: the ten moments'
    chain, and beside it the strategies' chains one after another (no record depends on time). Each
    chain is two one-thread trainers at once; all four chains at once made eight, which starved the
    test worker beside this one (a calibration there timed its steps 4x slower). "ten_moments" or a
    strategy -> the future of its chain's result; a chain's failure is raised in its own test."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        chains = {"ten_moments": pool.submit(kill_at_ten_moments, tmp_path_factory.mktemp("ten_moments"), data_dir)}
        for strategy in STRATEGY_SETTINGS:
            folder = tmp_path_factory.mktemp(strategy)
            chains[strategy] = pool.submit(kill_and_resume, strategy, folder, data_dir, smoke_model_dir)
        return chains


# the most state (greso: test_allocation_training.py); VIGOR and HORA keep none between steps, but
# a kill inside a step's rounds of sampling must resume as if it never happened
@pytest.mark.parametrize("strategy", list(STRATEGY_SETTINGS))
def test_kill_9_resumes_the_allocation_state_exactly(kill_chains, strategy):
    """A strategy killed (Pilot-Commit's buffer of pilot rollouts and its evicted prompts, 3 times;
    VIGOR's and HORA's rounds within a step, once inside them): the resumed run's log, final state and
    weights equal a straight run's. The warm-started model, so that groups are mixed and the state fills."""
    folder = kill_chains[strategy].result()
    import torch

    straight, killed = folder / "straight", folder / "killed"
    assert without_timings(read_lines(killed / "train_log.jsonl")) == without_timings(
        read_lines(straight / "train_log.jsonl")
    )
    info = json.loads((killed / "run.json").read_text())
    resumed_from = [r["checkpoint"] for r in info["resumed"]]
    assert resumed_from == RESUMED_FROM[strategy]
    final = "checkpoints/step-000010"
    state = lambda run: torch.load(run / final / "rank-0.pt", weights_only=False)["allocation"]
    assert state(killed) == state(straight)
    if strategy == "pilot_commit":
        for checkpoint in resumed_from:  # every resume restored a non-empty buffer with its pilot rollouts
            start = torch.load(killed / "checkpoints" / checkpoint / "rank-0.pt", weights_only=False)["allocation"]
            assert start["buffer"] and sorted(start["pilots"]) == sorted(p for p, *_ in start["buffer"])
        assert state(straight)  # a non-empty state, restored exactly
    else:  # groups of different sizes in every step, the same ones after the kills
        steps = read_lines(straight / "train_log.jsonl")
        assert all(r["rollouts_in_groups"] == r["rollouts_generated"] for r in steps)
        assert any(r["group_size_min"] < r["group_size_max"] for r in steps)
    sha = lambda run: json.loads((run / final / "state.json").read_text())["params_sha256"]
    assert sha(killed) == sha(straight)
