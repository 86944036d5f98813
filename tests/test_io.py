"""Crash-safe writers: whole files appear at once, with ordinary permissions."""

import os
import stat

import pytest

from pods_bench.errors import PodsBenchError
from pods_bench.io import append_jsonl, atomic_write_json, atomic_write_with, read_jsonl, truncate_jsonl


def test_atomic_files_get_the_permissions_a_plain_open_would_give(tmp_path):
    umask = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "a.json", {"x": 1})
        atomic_write_with(tmp_path / "b.txt", lambda p: p.write_text("hi"))
    finally:
        os.umask(umask)
    for name in ("a.json", "b.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.txt"]  # no temp files left


def test_a_failed_writer_leaves_no_file(tmp_path):
    def broken(path):
        path.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write_with(tmp_path / "c.csv", broken)
    assert list(tmp_path.iterdir()) == []


def test_torn_tail_is_dropped_and_truncate_keeps_complete_records(tmp_path):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, [{"step": 1}, {"step": 2}])
    with open(path, "a") as f:
        f.write('{"step": 3')  # a crash mid-append
    with pytest.raises(PodsBenchError, match="line 3"):
        read_jsonl(path)
    assert read_jsonl(path, drop_torn_tail=True) == [{"step": 1}, {"step": 2}]
    assert truncate_jsonl(path, lambda r: r["step"] <= 1) == 1
    assert read_jsonl(path) == [{"step": 1}]
