"""Crash-safe writers: whole files appear at once, with ordinary permissions."""

import os
import stat

import pytest

from pods_bench.errors import PodsBenchError
from pods_bench.io import (
    append_jsonl,
    atomic_write_json,
    atomic_write_with,
    read_jsonl,
    remove_temporaries,
    truncate_jsonl,
)


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


def test_an_append_after_a_crash_mid_append_starts_on_a_fresh_line(tmp_path):
    path = tmp_path / "eval.jsonl"
    append_jsonl(path, [{"step": 0, "benchmark": "arith"}])
    with open(path, "a") as f:
        f.write('{"step": 0, "benchmark": "gsm8k", "answer_acc": [0.')  # killed mid-append
    append_jsonl(path, [{"step": 0, "benchmark": "gsm8k"}])
    assert read_jsonl(path) == [{"step": 0, "benchmark": "arith"}, {"step": 0, "benchmark": "gsm8k"}]

    big = tmp_path / "big.jsonl"  # a torn line longer than the backwards-reading block
    big.write_text('{"a": 1}\n{"b": "' + "x" * 200_000)
    append_jsonl(big, [{"c": 3}])
    assert read_jsonl(big) == [{"a": 1}, {"c": 3}]
    only_torn = tmp_path / "torn.jsonl"
    only_torn.write_text('{"a"')
    append_jsonl(only_torn, [{"c": 3}])
    assert read_jsonl(only_torn) == [{"c": 3}]


def test_temporaries_left_by_a_killed_writer_are_recognised(tmp_path):
    # as atomic_write_with names them: .<name>.<random>.tmp<suffix> (no suffix for a name without one)
    left = [".run.json.k3j_x9a2.tmp.json", ".accuracy.png.ab12cd34.tmp.png", ".NOTES.x1y2z3w4.tmp"]
    for name in left + [".hidden", "run.json", "notes.tmp"]:
        (tmp_path / name).write_text("x")
    assert sorted(remove_temporaries(tmp_path)) == sorted(left)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", "notes.tmp", "run.json"]
