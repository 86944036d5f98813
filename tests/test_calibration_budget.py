"""The calibration's arithmetic and files (pods_bench/calibration.py) without training: a timed run
read off a train log written here, the budget resolved from given step times, the files and the
printed report. tests/test_calibration.py times real runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from pods_bench.calibration import (
    UNTIMED_STEPS,
    baseline_settings,
    read_timed_run,
    report,
    resolve_budget,
    write_calibration,
)
from pods_bench.errors import PodsBenchError
from tests.tiny_runs import tiny_run


def write_timed_run(run_dir, clock, threads=3):
    run_dir.mkdir(parents=True)
    lines = [json.dumps({"step": i + 1, "train_time_s": t}) for i, t in enumerate(clock)]
    (run_dir / "train_log.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "run.json").write_text(json.dumps({"hardware": {"torch_threads": threads}}))


def test_a_timed_run_is_read_off_its_training_clock(tmp_path):
    # 2 untimed steps end at 1.0 and 3.0 s; the 3 timed ones end at 4.5, 7.0 and 8.0 s
    assert UNTIMED_STEPS == 2
    write_timed_run(tmp_path / "run-0", [1.0, 3.0, 4.5, 7.0, 8.0])
    assert read_timed_run(tmp_path / "run-0", 3, 0, tmp_path / "run-0.log") == ([1.5, 2.5, 1.0], 3)


def test_a_timed_run_that_logged_another_number_of_steps_stops_with_one_line(tmp_path):
    write_timed_run(tmp_path / "run-0", [1.0, 3.0, 4.5, 7.0])
    with pytest.raises(PodsBenchError, match=r"^calibration: the timed run logged 4 of 5 steps$"):
        read_timed_run(tmp_path / "run-0", 3, 0, tmp_path / "run-0.log")


@pytest.mark.parametrize(
    "returncode, output, last", [(1, "loading\nstarting\nOSError: no-model does not exist\n\n", "OSError: no-model does not exist"),
                                 (-9, "", "(no output)")]
)  # fmt: skip
def test_a_timed_run_that_failed_stops_with_the_last_line_of_its_output(tmp_path, returncode, output, last):
    log = tmp_path / "run-0.log"
    log.write_text(output)
    with pytest.raises(PodsBenchError) as error:
        read_timed_run(tmp_path / "run-0", 3, returncode, log)
    assert str(error.value) == f"calibration: the timed run {tmp_path / 'run-0'} failed ({log}): {last}"


PER_RUN = [([1.0, 3.0], 2), ([2.0, 10.0], 3)]  # two runs side by side, two timed steps each


def test_the_budget_is_steps_at_the_median_step_time():
    c = resolve_budget("grpo", PER_RUN, steps=40, checkpoints=8, cap=None)
    # median of 1, 2, 3, 10 = 2.5 s (the mean, 4, would follow the one slow step); 40 steps = 100 s
    hardware = c.pop("hardware")
    assert c == {
        "arm": "grpo",
        "steps": 40,
        "checkpoints": 8,
        "untimed_steps": 2,
        "timed_steps": 2,
        "side_by_side": 2,
        "step_times_s": [[1.0, 3.0], [2.0, 10.0]],
        "torch_threads": [2, 3],
        "seconds_per_step": 2.5,
        "budget_s": 100.0,
        "checkpoint_every_s": 12.5,
        "cap_s": None,
        "capped": False,
    }
    assert hardware["torch_threads"] == torch.get_num_threads()


@pytest.mark.parametrize("cap, budget, capped", [(50, 50.0, True), (100, 100.0, False), (100.5, 100.0, False)])
def test_max_train_time_caps_the_budget_only_when_it_is_below(cap, budget, capped):
    c = resolve_budget("grpo", PER_RUN, steps=40, checkpoints=8, cap=cap)
    assert (c["budget_s"], c["capped"], c["cap_s"]) == (budget, capped, cap)
    assert type(c["budget_s"]) is float and c["checkpoint_every_s"] == budget / 8


def test_the_files_hold_the_shared_settings_with_the_calibrated_budget(tmp_path):
    settings = {"device": "cpu", "budget": {"max_train_time_s": 600, "checkpoint_every_s": 5}, "seed": 0}
    c = resolve_budget("grpo", PER_RUN, steps=40, checkpoints=8, cap=600)
    write_calibration(tmp_path, settings, c)
    text = (tmp_path / "train.yaml").read_text()
    assert text.splitlines()[:2] == [
        "# train.yaml: the shared trainer settings with the budget of 40 steps of grpo",
        "# at 2.500 s/step on this machine, 2 run(s) side by side (calibration.json; pods_bench/calibration.py)",
    ]
    written = yaml.safe_load(text)
    assert written == {"device": "cpu", "budget": {"max_train_time_s": 100.0, "checkpoint_every_s": 12.5}, "seed": 0}
    assert list(written) == ["device", "budget", "seed"]  # the settings' own order
    assert settings["budget"] == {"max_train_time_s": 600, "checkpoint_every_s": 5}  # not modified
    # a budget section the settings lack is added; its other keys are kept
    write_calibration(tmp_path, {"budget": {"max_steps": None}}, c)
    assert yaml.safe_load((tmp_path / "train.yaml").read_text())["budget"] == {
        "max_steps": None, "max_train_time_s": 100.0, "checkpoint_every_s": 12.5,
    }  # fmt: skip
    write_calibration(tmp_path, {}, c)
    assert yaml.safe_load((tmp_path / "train.yaml").read_text()) == {
        "budget": {"max_train_time_s": 100.0, "checkpoint_every_s": 12.5}
    }
    raw = (tmp_path / "calibration.json").read_text()
    assert json.loads(raw) == c and raw.endswith("}\n") and raw.splitlines()[1] == ' "arm": "grpo",'


def test_the_report_says_the_budget_and_a_cap():
    c = resolve_budget("grpo", PER_RUN, steps=40, checkpoints=8, cap=None)
    out = "results/smoke/calibration"
    assert report(c, Path(out)) == (
        "grpo: 2.500 s/step (median of 2 steps x 2 run(s) side by side, after 2 untimed) -> a budget of "
        "100.0 s (40 steps), a checkpoint every 12.50 s\n"
        f"wrote {out}/calibration.json and {out}/train.yaml"
    )
    capped = report(resolve_budget("grpo", PER_RUN, steps=40, checkpoints=8, cap=50), Path(out)).splitlines()
    assert capped[1] == "pods-bench calibrate: warning: the budget is capped at 50 s (budget.max_train_time_s)"
    assert len(capped) == 3


@pytest.fixture
def shared_settings(tmp_path):
    settings = tiny_run(tmp_path / "unused", budget={"max_train_time_s": 600, "checkpoint_every_s": 5})
    del settings["output_dir"]
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path, settings


def test_the_baseline_is_checked_before_anything_runs(tmp_path, shared_settings):
    path, settings = shared_settings
    assert baseline_settings(path, ["arm=grpo", "selection.rule=all", "selection.m=4"], 40, 8, 2, 2) == (
        "grpo",
        settings,
    )
    # an empty settings file: the defaults, and no budget needed to check the baseline
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert baseline_settings(empty, ["arm=grpo"], 40, 8, 2, 1) == ("grpo", {})
    for counts in ((0, 8, 2, 1), (40, 0, 2, 1), (40, 8, 0, 1), (40, 8, 2, 0)):
        with pytest.raises(PodsBenchError) as error:
            baseline_settings(path, [], *counts)
        assert str(error.value) == "calibration: steps, checkpoints, timed steps and side-by-side runs must be >= 1"
    with pytest.raises(PodsBenchError, match="selection.rule"):
        baseline_settings(path, ["selection.rule=nope"], 40, 8, 2, 1)
