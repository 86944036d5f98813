"""A budget in baseline steps (pods_bench/calibration.py): a real timed run of the tiny model, the
budget it resolves to, the calibrated settings the training jobs read, and the cap."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from pods_bench.calibration import calibrate
from pods_bench.cli import main
from pods_bench.config import load_config
from pods_bench.errors import PodsBenchError
from pods_bench.io import read_jsonl
from tests.tiny_runs import tiny_run

BASELINE = ["arm=grpo", "selection.rule=all", "selection.n=4", "selection.m=4", "seed=0"]


@pytest.fixture
def shared_settings(tmp_path):
    """The shared trainer settings as the workflow writes them (results/<exp>/configs/train.yaml), with
    a cap (max_train_time_s) no budget of these tests reaches: on a loaded machine a tiny step took
    20 s, and 40 of them passed a cap of 600 s (test_max_train_time_caps_the_budget sets its own)."""
    settings = tiny_run(tmp_path / "unused", budget={"max_train_time_s": 86400, "checkpoint_every_s": 5})
    del settings["output_dir"]
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def test_the_budget_is_steps_of_the_baseline_timed_here_side_by_side(tmp_path, shared_settings):
    out = tmp_path / "calibration"
    assert main(["calibrate", "--config", str(shared_settings), *[f"--set={s}" for s in BASELINE],
                 "--steps", "40", "--checkpoints", "8", "--timed-steps", "2", "--side-by-side", "2",
                 "--out", str(out)]) == 0  # fmt: skip
    c = json.loads((out / "calibration.json").read_text())
    # two timed runs at once, as two arms train: each two untimed steps (warm-up), then two timed
    # ones, read off its own training clock
    for run, times in zip(("run-0", "run-1"), c["step_times_s"], strict=True):
        log = list(read_jsonl(out / run / "train_log.jsonl"))
        clock = [r["train_time_s"] for r in log]
        assert len(clock) == 4 and times == pytest.approx([clock[2] - clock[1], clock[3] - clock[2]])
        assert json.loads((out / run / "run.json").read_text())["config"]["arm"] == "grpo"
    every_step = [t for times in c["step_times_s"] for t in times]
    # the median, so that one step slowed by another process does not stretch every arm's budget
    assert c["seconds_per_step"] == pytest.approx(statistics.median(every_step)) and c["seconds_per_step"] > 0
    assert c["untimed_steps"] == 2
    assert c["budget_s"] == pytest.approx(40 * c["seconds_per_step"])
    assert c["checkpoint_every_s"] == pytest.approx(c["budget_s"] / 8)
    assert (c["arm"], c["steps"], c["checkpoints"], c["timed_steps"], c["side_by_side"], c["capped"]) == (
        "grpo", 40, 8, 2, 2, False,
    )  # fmt: skip
    assert c["hardware"]["torch_threads"] >= 1
    # each timed run's torch threads, read from its run.json (the workflow test holds them to the arms')
    assert c["torch_threads"] == [
        json.loads((out / run / "run.json").read_text())["hardware"]["torch_threads"] for run in ("run-0", "run-1")
    ]
    # what the training jobs read: the shared settings with that budget, nothing else changed
    calibrated = yaml.safe_load((out / "train.yaml").read_text())
    original = yaml.safe_load(shared_settings.read_text())
    assert {k: v for k, v in calibrated.items() if k != "budget"} == {
        k: v for k, v in original.items() if k != "budget"
    }
    cfg = load_config(out / "train.yaml", ["arm=pods"])
    assert cfg.budget.max_train_time_s == pytest.approx(c["budget_s"])
    assert cfg.budget.checkpoint_every_s == pytest.approx(c["checkpoint_every_s"])


def test_max_train_time_caps_the_budget(tmp_path, shared_settings):
    settings = yaml.safe_load(shared_settings.read_text())
    settings["budget"]["max_train_time_s"] = 0.001  # below one step of any machine
    shared_settings.write_text(yaml.safe_dump(settings))
    c = calibrate(shared_settings, BASELINE, steps=10, checkpoints=4, timed=1, out=tmp_path / "calibration")
    assert c["capped"] and c["budget_s"] == 0.001 and c["cap_s"] == 0.001
    assert c["checkpoint_every_s"] == pytest.approx(0.001 / 4)


def test_a_timed_run_that_fails_stops_with_one_line(tmp_path, shared_settings):
    with pytest.raises(
        PodsBenchError, match=r"^calibration: the timed run .*run-0 failed \(.*run-0.log\): .*no-model does not exist$"
    ):
        calibrate(shared_settings, [*BASELINE, f"model.name={tmp_path / 'no-model'}"], steps=10, checkpoints=4,
                  timed=1, out=tmp_path / "calibration")  # fmt: skip
