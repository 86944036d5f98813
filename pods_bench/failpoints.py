"""Fault injection: let a process kill itself with SIGKILL at a named point, to test crash recovery.

    PODS_BENCH_KILL_AT=<point>:<hit>[:<delay_ms>]

The process counts how often it reaches `<point>`; at the `<hit>`-th time it sends itself SIGKILL
at once, or has a forked killer process send it `<delay_ms>` later while the work after the point
goes on (so the kill lands somewhere inside that work, not on a line chosen in advance; a separate
process, because a timer thread needs the GIL, which a long C call can hold past the delay).
SIGKILL cannot be caught: no `finally`, no atexit, no flush runs, exactly as when a scheduler
preempts a job or a node dies.

Points (see where `failpoint(...)` is called):
  gen         a training step's generation begins
  update      a training step's policy update begins
  checkpoint  a checkpoint starts to be written (the temporary folder exists)
  eval        an evaluation of one checkpoint begins
  append_train_log, append_eval
              half of an append to train_log.jsonl / eval.jsonl is on disk (a kill here leaves a
              torn last line; `append_<stem>` for any other JSON Lines file)

Unset (the normal case) `failpoint` is one dictionary lookup. tests/test_crash_resume.py uses it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

ENV = "PODS_BENCH_KILL_AT"
POINTS = ("gen", "update", "checkpoint", "eval", "append_train_log", "append_eval")

_hits: dict[str, int] = {}


def _parse(spec: str) -> tuple[str, int, float]:
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not (parts[0] in POINTS or parts[0].startswith("append_")):
        raise ValueError(f"{ENV}={spec!r}: expected <point>:<hit>[:<delay_ms>] with a point from {', '.join(POINTS)}")
    return parts[0], int(parts[1]), float(parts[2]) / 1000 if len(parts) == 3 else 0.0


def _kill_later(delay_s: float) -> None:
    """Fork a process that sleeps, then SIGKILLs this one (unless it has exited meanwhile)."""
    target = os.getpid()
    if os.fork() == 0:  # the killer: only system calls, then _exit (nothing of the parent runs here)
        time.sleep(delay_s)
        if os.getppid() == target:
            os.kill(target, signal.SIGKILL)
        os._exit(0)


def failpoint(point: str) -> None:
    """Count a pass through `point`; kill this process if PODS_BENCH_KILL_AT says so."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, hit, delay_s = _parse(spec)
    if point != target:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] != hit:
        return
    print(f"failpoint: SIGKILL at {point} #{hit} + {delay_s * 1000:.0f} ms", file=sys.stderr, flush=True)
    if delay_s <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
    _kill_later(delay_s)
