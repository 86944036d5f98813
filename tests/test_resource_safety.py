"""Grading processes never outlive the command that started them: not after a normal end, an
exception in the middle of training or evaluation, Ctrl-C or SIGTERM (a scheduler's stop), and not
after SIGKILL either (the workers notice their parent is gone; tests/test_crash_resume.py).
tests/conftest.py also checks after every test module that nothing was left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import yaml

from pods_bench.config import config_from_dict
from pods_bench.evaluate import evaluate_run
from pods_bench.rewards import RewardConfig, RewardFunction
from pods_bench.train import train
from tests.processes import (
    handles_signal,
    leftover_processes,
    session_processes,
    still_running_after,
    with_default_signals,
)
from tests.tiny_runs import read_lines, tiny_run

WITH_POOL = {"workers": 1}  # a real grading process


def test_the_grading_pool_starts_workers_and_close_stops_them():
    with RewardFunction(RewardConfig(workers=2)) as reward:
        reward(["<answer>1</answer>"], ["1"])
        pids = reward.worker_pids()
        assert len(pids) == 2 and {p.pid for p in leftover_processes()} >= set(pids)
    assert still_running_after(leftover_processes, 5.0) == []


def test_an_exception_mid_training_shuts_the_pool_down(tmp_path, monkeypatch):
    import pods_bench.train as trainer

    calls = {"n": 0}
    real_update = trainer.update_policy

    def failing_update(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_update(*args, **kwargs)

    monkeypatch.setattr(trainer, "update_policy", failing_update)
    cfg = config_from_dict(tiny_run(tmp_path / "run", reward=WITH_POOL, eval={"inline": False}))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        train(cfg, progress=False)
    assert still_running_after(leftover_processes, 5.0) == []
    info = json.loads((tmp_path / "run/run.json").read_text())
    assert (info["status"], info["step"]) == ("stopped", 1)


def test_an_exception_mid_evaluation_shuts_the_pool_down(tmp_path, monkeypatch):
    run_dir = train(
        config_from_dict(
            tiny_run(tmp_path / "run", budget={"max_steps": 1}, reward=WITH_POOL, eval={"inline": False})
        ),
        progress=False,
    )
    import pods_bench.evaluate as evaluation

    def failing(*args, **kwargs):
        raise MemoryError("out of memory while evaluating")

    monkeypatch.setattr(evaluation, "evaluate_checkpoint", failing)
    with pytest.raises(MemoryError):
        evaluate_run(run_dir)
    assert still_running_after(leftover_processes, 5.0) == []
    assert not (run_dir / "eval.jsonl").exists()


SIGNALS = {
    "SIGINT": (signal.SIGINT, 130, "pods-bench: interrupted"),
    "SIGTERM": (signal.SIGTERM, 143, "pods-bench: terminated (SIGTERM)"),
}


def stop_and_resume(folder, sig) -> dict:
    """`pods-bench train` from an interactive shell, sent `sig` once it has logged two steps, then
    the same command again: the stopped trainer's exit code and stderr, what was still running 10 s
    later, the run's status, and the resumed command's outcome."""
    config = folder / "train.yaml"
    config.write_text(
        yaml.safe_dump(tiny_run(folder / "run", reward=WITH_POOL, budget={"max_steps": 400}, eval={"inline": False}))
    )
    command = [sys.executable, "-m", "pods_bench", "train", "--config", str(config), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # as from an interactive shell, whatever this test run inherited (a backgrounded shell ignores SIGINT)
    proc = subprocess.Popen(
        with_default_signals(command), env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    log = folder / "run/train_log.jsonl"
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.05)
    if not handles_signal(proc.pid, sig):
        proc.kill()  # the signal would not stop it
        pytest.fail(f"the trainer has no handler for {sig.name} (SigCgt in /proc/{proc.pid}/status)")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    stopped = {
        "code": proc.returncode,
        "stderr": err,
        "left_running": still_running_after(lambda: session_processes(proc.pid), 10.0),  # the grading worker too
        "status": json.loads((folder / "run/run.json").read_text())["status"],
    }
    # rerunning the command resumes from the last checkpoint (step 0 here) and finishes
    resumed = subprocess.run(command + ["--set", "budget.max_steps=3"], env=env, capture_output=True, text=True)
    return {**stopped, "resumed": resumed, "steps": [r["step"] for r in read_lines(log)]}


@pytest.fixture(scope="module")
def stopped_runs(tmp_path_factory) -> dict[str, Future]:
    """Both signals' runs side by side (one-thread trainers); signal name -> the future of its outcome."""
    with ThreadPoolExecutor(max_workers=len(SIGNALS)) as pool:
        return {
            name: pool.submit(stop_and_resume, tmp_path_factory.mktemp(name), sig)
            for name, (sig, _, _) in SIGNALS.items()
        }


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIGNALS))
def test_ctrl_c_and_sigterm_stop_cleanly_and_the_run_resumes(stopped_runs, name):
    _, code, message = SIGNALS[name]
    outcome = stopped_runs[name].result()
    assert outcome["code"] == code, outcome["stderr"][-2000:]
    assert outcome["stderr"].strip().splitlines()[-1] == message and "Traceback" not in outcome["stderr"]
    assert outcome["status"] == "stopped"
    assert outcome["left_running"] == []
    assert outcome["resumed"].returncode == 0, outcome["resumed"].stderr[-2000:]
    assert outcome["steps"] == [1, 2, 3]
