"""`make gpu-check` in its CPU mode (tiny shapes), as CI runs it: every part of the GPU check runs
for real and the report holds what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_runs_in_cpu_mode_and_reports(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pods_bench", "gpu-check", "--device", "cpu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device"] == "cpu" and report["hardware_setup"] == "cpu"
    assert report["cuda_tests"]["ran"] is False
    smoke = {r["arm"]: r for r in report["smoke"]}
    assert set(smoke) == {"grpo_n8_m8", "pods_n8_m2"}
    assert all(r["steps"] == 2 and r["gen_s"] > 0 and r["update_s"] > 0 for r in smoke.values())
    rows = report["paper_scale"]
    assert [(r["mode"], r["n"], r["m"]) for r in rows] == [
        ("lora", 4, 4),
        ("lora", 8, 4),
        ("full", 4, 4),
        ("full", 8, 4),
    ]
    for r in rows:
        assert r["completion_tokens"] == r["n"] * 16  # a random model decodes to the limit
        assert r["gen_s"] > 0 and r["update_s"] > 0 and r["plan_update_mib"] > 0 and r["plan_gen_s"] > 0
        assert r["peak_update_mib"] is None  # the CUDA allocator's; on CPU tests/test_planning.py measures
    assert report["packages"]["torch"] and report["seconds"] > 0
    text = (tmp_path / "gpu_check.md").read_text()
    assert text.startswith("# GPU check:") and "| lora | 8/4 |" in text
