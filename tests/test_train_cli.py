"""`pods-bench train` / `pods-bench evaluate` on bad input: exit status 2, one line on stderr, no
traceback, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from pods_bench.cli import main as cli
from tests.tiny_runs import tiny_run


def write_config(tmp_path, **sections):
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(tiny_run(tmp_path / "run", **sections)))
    return path


def assert_one_line_error(capsys, needle: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pods-bench: error: ") and needle in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["selection.m=8"], "selection.m (8) must be <= selection.n (4)"),
        (["selection.rule=best_of"], "unknown rule 'best_of'"),
        (["engine.name=tgi"], "unknown engine 'tgi'"),
        (["task.name=gsm8k", "task.limit=null"], "empty file (no rows)"),  # data_dir below has an empty train split
    ],
)
def test_train_bad_input(tmp_path, capsys, overrides, needle):
    empty = tmp_path / "data" / "gsm8k"
    empty.mkdir(parents=True)
    (empty / "train.jsonl").write_text("")
    config = write_config(tmp_path, data_dir=str(tmp_path / "data"), budget={"max_steps": 1}, eval={"inline": False})
    args = ["train", "--config", str(config), "--no-progress"] + [a for o in overrides for a in ("--set", o)]
    assert cli(args) == 2
    assert_one_line_error(capsys, needle)
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_evaluate_bad_input(tmp_path, capsys):
    assert cli(["evaluate", str(tmp_path / "nowhere")]) == 2
    assert_one_line_error(capsys, "is not a run folder (no run.json)")

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"config": tiny_run(run_dir)}))
    assert cli(["evaluate", str(run_dir)]) == 2
    assert_one_line_error(capsys, "has no complete checkpoint")
    assert cli(["evaluate", str(run_dir), "--set", "eval.repeats=0"]) == 2
    assert_one_line_error(capsys, "eval.repeats must be >= 1")
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]


def test_a_real_process_prints_one_line_and_no_traceback(tmp_path):
    config = write_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pods_bench", "train", "--config", str(config), "--set", "selection.m=99"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["pods-bench: error: config key selection.m (99) must be <= selection.n (4)"]
    assert not (tmp_path / "run").exists()
