"""`pods-bench evaluate` writes no progress bars: the workflow's evaluation jobs keep its stderr in
their logs, and transformers draws a "Loading weights" bar each time a checkpoint is loaded
(hundreds of lines per run)."""

from __future__ import annotations

import os
import subprocess
import sys

from pods_bench.config import config_from_dict
from pods_bench.train import train
from tests.tiny_runs import read_lines, tiny_run


def test_evaluating_a_run_prints_no_progress_bars(tmp_path):
    run_dir = train(
        config_from_dict(
            tiny_run(tmp_path / "run", budget={"max_steps": 2, "checkpoint_every_steps": 1}, eval={"inline": False})
        ),
        progress=False,
    )
    out = subprocess.run(
        [sys.executable, "-m", "pods_bench", "evaluate", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )

    assert out.returncode == 0, out.stderr[-2000:]
    assert len(read_lines(run_dir / "eval.jsonl")) == 3  # steps 0, 1, 2: three checkpoints were loaded
    assert "Loading weights" not in out.stderr and "%|" not in out.stderr, out.stderr[-2000:]  # nor any other bar
