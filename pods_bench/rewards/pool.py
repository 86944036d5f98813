"""The killable worker pool: `workers` processes that each grade with a `_Grader`, and a parent
that kills and replaces a worker still busy with one item after the hard deadline (math-verify's
SIGALRM timeouts cannot stop a long C-level sympy or bigint operation)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_for_connections

from pods_bench.errors import PodsBenchError
from pods_bench.rewards.grading import ERROR, KILLED, TIMEOUT, _Grader

# --- the worker process --------------------------------------------------------------------------


def _limit_address_space(extra_mb: int) -> None:
    """Let this process allocate at most `extra_mb` more address space, so that a runaway bigint
    becomes a MemoryError (scored 0) rather than a machine-wide out-of-memory. Relative to the current
    size because a forked worker inherits its parent's (possibly huge) mappings. Linux only."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[0])
    except (ImportError, OSError):
        return
    limit = pages * os.sysconf("SC_PAGE_SIZE") + extra_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _worker_main(conn, timeout: int, memory_limit_mb: int | None) -> None:
    """Worker process: receive chunks of (index, answer, gold, mode), send back one
    (index, score, status, seconds) per item as soon as it is graded; exit on None or a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    if memory_limit_mb:
        _limit_address_space(memory_limit_mb)
    with _Grader(timeout) as grader:
        # The first parse in a process pays ~1 s of lazy imports and parser set-up: pay it before
        # reporting ready, not on the clock of the first item.
        grader.grade(r"\frac{1}{2}", "0.5")
        conn.send("ready")
        while True:
            try:
                chunk = conn.recv()
            except (EOFError, OSError):
                return
            if chunk is None:
                return
            for index, answer, gold, mode in chunk:
                started = time.perf_counter()
                try:
                    score, status = grader.grade(answer, gold, mode)
                except BaseException:  # e.g. a TimeoutException raised outside math-verify's own handlers
                    score, status = 0.0, TIMEOUT
                conn.send((index, score, status, time.perf_counter() - started))


# --- the worker pool ---------------------------------------------------------------------------


_STARTUP_TIMEOUT_S = 120.0


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: mp.connection.Connection
    pending: deque = field(default_factory=deque)  # items sent and not yet answered, in order
    started: float = 0.0  # when the item at pending[0] started (monotonic)


class _GraderPool:
    """`workers` grading processes with a hard per-item deadline: a worker still on one item after
    `deadline_s` is killed and replaced. (concurrent.futures cannot kill one task's process, hence
    this small pool.)"""

    def __init__(self, workers: int, start_method: str, timeout: int, memory_limit_mb: int | None):
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # workers fork from a server that has already imported math-verify
            self._ctx.set_forkserver_preload(["pods_bench.rewards.grading"])
        self._args = (timeout, memory_limit_mb)
        self._workers = [self._start_worker() for _ in range(workers)]
        for w in self._workers:
            self._await_ready(w)
        self.restarts = 0

    def _start_worker(self) -> _Worker:
        parent_end, child_end = self._ctx.Pipe()
        process = self._ctx.Process(
            target=_worker_main, args=(child_end, *self._args), daemon=True, name="pods-bench-grader"
        )
        process.start()
        child_end.close()
        return _Worker(process, parent_end)

    @staticmethod
    def _await_ready(w: _Worker) -> None:
        try:
            ready = w.conn.poll(_STARTUP_TIMEOUT_S) and w.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            w.process.kill()
            raise PodsBenchError(
                "a reward grading process failed to start; with start method 'forkserver' or 'spawn' the "
                "main script must guard its code with `if __name__ == '__main__':`"
            )

    def _replace(self, worker: _Worker) -> _Worker:
        worker.process.kill()
        worker.process.join()
        worker.conn.close()
        fresh = self._start_worker()
        self._await_ready(fresh)
        self._workers[self._workers.index(worker)] = fresh
        self.restarts += 1
        return fresh

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def grade(self, chunks: list[list[tuple]], deadline_s: float) -> dict[int, tuple[float, int, float]]:
        """Grade chunks of (index, answer, gold, mode): {index: (score, status, seconds)}."""
        items = {item[0]: item for chunk in chunks for item in chunk}
        queue, results = deque(chunks), {}
        while queue or any(w.pending for w in self._workers):
            for w in self._workers:
                if not w.pending and queue:
                    self._send(w, queue.popleft())
            busy = [w for w in self._workers if w.pending]
            next_deadline = min(w.started for w in busy) + deadline_s
            ready = wait_for_connections([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            for w in busy:
                try:
                    while w.conn in ready and w.pending and w.conn.poll():
                        _index, score, status, seconds = w.conn.recv()  # in the order sent
                        results[w.pending.popleft()] = (score, status, seconds)
                        w.started = time.monotonic()
                except (EOFError, OSError):  # the worker died (e.g. killed by the OS)
                    self._lose_current_item(w, ERROR, items, queue, results)
                    continue
                if w.pending and time.monotonic() - w.started > deadline_s:
                    self._lose_current_item(w, KILLED, items, queue, results)
        return results

    def _send(self, w: _Worker, chunk: list[tuple]) -> None:
        try:
            w.conn.send(chunk)
        except OSError:  # died while idle: replace it and send again
            w = self._replace(w)
            w.conn.send(chunk)
        w.pending.extend(item[0] for item in chunk)
        w.started = time.monotonic()

    def _lose_current_item(self, w: _Worker, status: int, items: dict, queue: deque, results: dict) -> None:
        """Kill and replace the worker; its current item scores 0 with `status`, the rest of its
        chunk goes back to the front of the queue."""
        results[w.pending.popleft()] = (0.0, status, time.monotonic() - w.started)
        if w.pending:
            queue.appendleft([items[i] for i in w.pending])
        self._replace(w)

    def close(self) -> None:
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in self._workers:
            w.process.join(timeout=2)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()
        self._workers = []
