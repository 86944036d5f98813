"""Crash-safe writing of result files.

Readers must never see a half-written file, so whole files are written to a temporary file in the
same folder and renamed over the target (rename is atomic on POSIX). JSON Lines logs are appended
one complete line at a time and fsynced; on resume they are truncated back to the last checkpoint
(`truncate_jsonl`), so a crash loses or duplicates nothing.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pods_bench.errors import PodsBenchError
from pods_bench.failpoints import failpoint


def _default_mode() -> int:
    """The mode a plain open() would give a new file (mkstemp's temporary files are 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_with(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Atomically produce `path` with a writer that takes a file path (e.g. `fig.savefig`,
    `df.to_csv`). The writer sees a temporary path beside `path` with the same suffix
    (`.<name>.<random>.tmp<suffix>`), renamed over `path` once the writer has returned."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    def write_synced(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    atomic_write_with(path, write_synced)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


_TEMPORARY = re.compile(r"^\..+\.tmp(\.[^.]+)?$")  # how atomic_write_with names its temporary files


def remove_temporaries(folder: str | os.PathLike) -> list[str]:
    """Delete the temporary files a crash mid-write left in `folder` (not recursive); their targets
    still hold the previous complete version. Returns the names removed."""
    folder = Path(folder)
    removed = []
    if folder.is_dir():
        for p in folder.iterdir():
            if p.is_file() and _TEMPORARY.match(p.name):
                p.unlink(missing_ok=True)
                removed.append(p.name)
    return removed


def append_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """Append complete lines and fsync. A crash mid-append leaves at most a torn last line, which
    `read_jsonl(..., drop_torn_tail=True)` skips and the next append cuts off before writing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, default=str) + "\n" for r in records).encode("utf-8")
    _cut_torn_tail(path)
    with open(path, "ab") as f:
        half = len(data) // 2
        f.write(data[:half])
        f.flush()
        failpoint(f"append_{path.stem}")  # crash tests kill here, leaving what a kill mid-write leaves
        f.write(data[half:])
        f.flush()
        os.fsync(f.fileno())


def _cut_torn_tail(path: Path, chunk: int = 1 << 16) -> None:
    """Truncate `path` after its last newline: drop the torn line a crash mid-append left, so that
    the next record starts on a line of its own instead of gluing onto the fragment."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        position = end
        while position > 0:
            start = max(0, position - chunk)
            f.seek(start)
            block = f.read(position - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                cut = start + newline + 1
                break
            position = start
        else:
            cut = 0
        if cut != end:
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike, drop_torn_tail: bool = False) -> list[dict]:
    """Read a JSON Lines file. A malformed line is an error naming file and line, except a torn
    final line (no trailing newline) when `drop_torn_tail` is set: that is what a crash mid-append
    leaves behind."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    torn = lines[-1] != ""
    records = []
    for i, line in enumerate(lines[:-1] if not torn else lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if drop_torn_tail and torn and i == len(lines):
                break
            raise PodsBenchError(f"{path}: line {i} is not valid JSON ({e.msg})") from None
    return records


def truncate_jsonl(path: str | os.PathLike, keep: Callable[[dict], bool]) -> int:
    """Rewrite `path` atomically keeping only complete records for which `keep` is true (used on
    resume: keep records up to the checkpoint being resumed). Returns how many were dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    records = read_jsonl(path, drop_torn_tail=True)
    kept = [r for r in records if keep(r)]
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in kept))
    return len(records) - len(kept)


@contextmanager
def locked(path: str | os.PathLike, busy: str | None = None):
    """Hold an exclusive lock on the file `path` (created if missing) for the block. The kernel
    releases it when the process ends, even by SIGKILL, so a crash never leaves a stale lock.
    With `busy`, fail at once with that message if another process holds the lock; else wait.
    (flock is advisory and per host: it keeps processes of one machine apart.)"""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (fcntl.LOCK_NB if busy else 0))
        except BlockingIOError:
            raise PodsBenchError(busy) from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
