"""Finding, waiting for and killing the processes a test started (psutil)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil

# Python's own per-interpreter helpers live as long as the test process by design; their children
# (e.g. grading workers forked by the forkserver) are checked like any other process.
_INTERPRETER_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


# A process started in the background by a non-interactive shell (`cmd &`, nohup, many CI runners)
# inherits SIGINT and SIGQUIT ignored, and Python then installs no KeyboardInterrupt handler; blocked
# signals are inherited too. A test that signals a process it started must not depend on how the test
# run itself was started, so it starts the process through this prefix: default dispositions, nothing
# blocked, then exec (same pid). A wrapper rather than Popen(preexec_fn=...), which is unsafe in a
# process with threads.
_RESTORE_SIGNALS = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM): signal.signal(s, signal.SIG_DFL)\n"
    "signal.pthread_sigmask(signal.SIG_SETMASK, [])\n"
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def with_default_signals(command: list[str]) -> list[str]:
    """`command` run with SIGINT, SIGQUIT and SIGTERM at their default dispositions and no signal
    blocked, whatever this process inherited."""
    return [sys.executable, "-c", _RESTORE_SIGNALS, *command]


def handles_signal(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler of its own for `sig` (caught: not ignored, not blocked,
    not the default action), from /proc/<pid>/status."""
    masks = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("SigBlk", "SigIgn", "SigCgt"):
                masks[key] = int(value, 16)
    bit = 1 << (sig - 1)
    return bool(masks["SigCgt"] & bit) and not (masks["SigIgn"] | masks["SigBlk"]) & bit


def _alive(processes) -> list[psutil.Process]:
    alive = []
    for p in processes:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def leftover_processes() -> list[psutil.Process]:
    """Live descendants of this process, except Python's forkserver and resource tracker."""
    found = []
    for child in psutil.Process().children():
        try:
            helper = any(h in " ".join(child.cmdline()) for h in _INTERPRETER_HELPERS)
            found += ([] if helper else [child]) + child.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    return _alive(found)


def session_processes(sid: int) -> list[psutil.Process]:
    """Live processes of session `sid` (a process started with start_new_session=True and every
    process it started, even after it died)."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (ProcessLookupError, PermissionError):
            pass
    return _alive(found)


def still_running_after(find: Callable[[], list], timeout_s: float) -> list:
    """What `find()` still returns after waiting up to `timeout_s` for it to become empty."""
    deadline = time.monotonic() + timeout_s
    while (alive := find()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def kill_tree(proc: subprocess.Popen, timeout_s: float = 20.0) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """SIGKILL `proc` and all its descendants at once, as a node failure or a scheduler's cgroup kill
    does. Returns (the processes killed, those still alive `timeout_s` later).

    The tree is frozen first (SIGSTOP, again for every process found since, until no new one
    appears): a job's shell listed and killed a moment after it started its trainer would otherwise
    leave that trainer running, orphaned, beside the rerun (seen under load). A stopped process
    cannot start another."""
    root, stopped = psutil.Process(proc.pid), {}
    while True:
        try:
            found = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        new = [p for p in found if p.pid not in stopped]
        if not new:
            break
        for p in new:
            stopped[p.pid] = p
            try:
                p.send_signal(signal.SIGSTOP)
            except psutil.NoSuchProcess:
                pass
    tree = list(stopped.values())
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    return tree, psutil.wait_procs(tree, timeout=timeout_s)[1]


@contextmanager
def running_beside(proc: subprocess.Popen, timeout_s: float = 900) -> Iterator[subprocess.Popen]:
    """`proc` runs while the block does: waited for when the block ends, and its whole process tree
    killed if the block fails (or the wait times out), so that no twin run outlives its test."""
    try:
        yield proc
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
