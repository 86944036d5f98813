"""`pods-bench profile` and `pods-bench project` run as a user runs them, checked against what the
other commands (`plan`, the train logs) say independently, not against their own arithmetic."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.tiny_runs import read_lines

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("gen", "reward", "select", "update", "sync")


@pytest.fixture
def paper_logs(data_dir) -> Path:
    """The published logs in the data folder: a mis-set folder fails (the data fixture's rule), never skips."""
    logs = data_dir / "pods-paper-logs"
    if not logs.is_dir():
        pytest.fail(f"no published logs at {logs}; set PODS_BENCH_DATA_DIR to the data folder")
    return logs


def pods_bench(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pods_bench", *args], capture_output=True, text=True, timeout=900, cwd=cwd
    )


def plan_step_seconds(config: Path, hardware: str, out: Path, *extra: str) -> dict[str, float]:
    done = pods_bench("plan", str(config), "--hardware", hardware, "--out", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return dict(pd.read_csv(out)[["arm", "step_s"]].itertuples(index=False))


def test_project_scales_the_published_runs_by_the_plans_step_times(tmp_path, paper_logs):
    """Published L40S GSM8K runs onto one H200: each arm's projected s/step is what `plan` predicts
    for it on the H200, and the speedup moves by the ratio of the two arms' predicted/measured."""
    out = tmp_path / "projection.csv"
    done = pods_bench(
        "project", str(paper_logs), "--experiment", "gsm8k-l40s-qwen", "--config", "config/gsm8k_main.yaml",
        "--hardware", "h200", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "projection (not a measurement)" in done.stdout
    rows = pd.read_csv(out).set_index("n")
    plan = plan_step_seconds(ROOT / "config/gsm8k_main.yaml", "h200", tmp_path / "plan.csv")
    grpo, pods = rows.loc[16], rows.loc[64]
    assert grpo["projected_s_per_step"] == pytest.approx(plan["grpo_n16_m16"], abs=1e-3)
    assert pods["projected_s_per_step"] == pytest.approx(plan["pods_n64_m16"], abs=1e-3)
    r = lambda row, arm: plan[arm] / row["measured_s_per_step"]
    expected = pods["measured_speedup"] * r(grpo, "grpo_n16_m16") / r(pods, "pods_n64_m16")
    assert pods["projected_speedup"] == pytest.approx(expected, rel=1e-3)
    assert pods["projected_speedup"] != pytest.approx(pods["measured_speedup"], rel=1e-2)  # it did move


def test_project_leaves_out_arms_that_sample_in_rounds(tmp_path, paper_logs):
    """An arm whose allocation strategy samples in rounds has no predicted step: its row says so and
    carries no projection; a baseline like that stops the command with one line."""
    config = yaml.safe_load((ROOT / "config/gsm8k_main.yaml").read_text())
    config["train_base"] = str(ROOT / config["train_base"])
    config["arms"]["pods_n64_m16"]["set"] = {"allocation.strategy": "dynamic_sampling"}
    arm_in_rounds = tmp_path / "rounds.yaml"
    arm_in_rounds.write_text(yaml.safe_dump(config))
    args = ("project", str(paper_logs), "--experiment", "gsm8k-l40s-qwen", "--hardware", "h200")
    done = pods_bench(*args, "--config", str(arm_in_rounds), "--out", str(tmp_path / "p.csv"))
    assert done.returncode == 0, done.stderr
    pods = pd.read_csv(tmp_path / "p.csv").set_index("n").loc[64]
    assert pods["note"] == "not projected: allocation dynamic_sampling samples in rounds"
    assert pd.isna(pods["projected_s_per_step"]) and pd.isna(pods["projected_speedup"])

    config["arms"]["grpo_n16_m16"]["set"] = {"allocation.strategy": "dynamic_sampling"}
    baseline_in_rounds = tmp_path / "baseline.yaml"
    baseline_in_rounds.write_text(yaml.safe_dump(config))
    done = pods_bench(*args, "--config", str(baseline_in_rounds))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "the baseline" in done.stderr and "cannot be projected" in done.stderr


def tiny_experiment(tmp_path: Path) -> Path:
    """Three arms of the smoke task on a small untrained model, no warm start."""
    config = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())
    config["experiment"] = "profile_test"
    config["warm_start"] = {"enabled": False}
    config["budget_in_baseline_steps"] = None  # the baseline arm is renamed; profile sets its own budget
    config["arms"] = {
        "grpo_n4_m4": {"rule": "all", "n": 4, "m": 4},
        "pods_n8_m2": {"rule": "max_variance", "n": 8, "m": 2},
        "grpo_n8_m8": {"rule": "all", "n": 8, "m": 8},
    }
    config["train"] |= {
        "prompts_per_step": 2,
        "model": {"name": "tiny", "tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}},
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "reward": {"workers": 0},
        # the first 64 problems: every train call renders and measures its prompts, all 10,100 took ~6 s a call
        "task": {**config["train"]["task"], "limit": 64},
    }
    path = tmp_path / "profile_test.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_profile_fits_on_some_arms_and_reports_the_others_as_the_plan_predicts_them(tmp_path, capfd):
    import json

    from pods_bench.cli import main

    config, out = tiny_experiment(tmp_path), tmp_path / "profile"
    # in this process (so that the mutation run sees it): the command line as a user types it
    assert main(["profile", str(config), "--fit", "grpo_n4_m4,pods_n8_m2", "--steps", "4", "--rounds", "2",
                 "--out", str(out)]) == 0  # fmt: skip
    assert "wrote " + str(out / "step_time_model.json") in capfd.readouterr().out
    source = json.loads((out / "step_time_model.json").read_text())["source"]
    assert source.startswith(f"profile of {config} on ") and source.endswith(", fitted on grpo_n4_m4, pods_n8_m2")
    rows = pd.read_csv(out / "validation.csv").set_index("arm")
    assert rows["role"].to_dict() == {"grpo_n4_m4": "fitted", "pods_n8_m2": "fitted", "grpo_n8_m8": "held out: n, m"}
    for arm, row in rows.iterrows():
        records = read_lines(out / "runs" / arm / "train_log.jsonl")
        assert len(records) == row["steps"] == 4  # two interleaved rounds of 2 steps
        measured = sum(sum(r[f"time_{p}_s"] for p in PHASES) for r in records) / len(records)
        assert row["measured_s"] == pytest.approx(measured, abs=1e-3)
        # the error is relative to the measurement: recomputed from the two columns, not read. Both columns
        # are rounded to 1e-4 s (so off by up to 5e-5 each) and the error to 0.1: the tolerance is what
        # that rounding can move the recomputed error, which grows as the step time shrinks
        m, p = row["measured_s"], row["predicted_s"]
        error = 100 * (p - m) / m
        assert row["error_pct"] == pytest.approx(error, abs=0.05 + 100 * 5e-5 * (1 / m + abs(p) / m**2) + 1e-9)
    # the held-out arm's prediction is what `plan` says with the fitted model on this machine's setup
    plan = plan_step_seconds(config, "cpu", tmp_path / "plan.csv", "--model", str(out / "step_time_model.json"))
    assert rows.loc["grpo_n8_m8", "predicted_s"] == pytest.approx(plan["grpo_n8_m8"], rel=1e-3)
    assert "fitted on grpo_n4_m4, pods_n8_m2" in pd.read_csv(tmp_path / "plan.csv")["step_time_source"][0]
    # bad input: an arm to fit on that the config does not have
    assert main(["profile", str(config), "--fit", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "pods-bench: error: --fit: no arm 'nope'" in capfd.readouterr().err


# --- the validation table from train logs written by hand (in-process, fast) ------------------------


def held_out_experiment(tmp_path: Path) -> Path:
    """tiny_experiment and a fourth arm held out by its completion limit: 4 new tokens where the others have 8."""
    path = tiny_experiment(tmp_path)
    config = yaml.safe_load(path.read_text())
    arms = config.pop("arms")  # in the order of tiny_experiment, the new arm last
    config["arms"] = {arm: arms[arm] for arm in ("grpo_n4_m4", "pods_n8_m2", "grpo_n8_m8")}
    config["arms"]["grpo_n4_m4_new4"] = {"rule": "all", "n": 4, "m": 4, "set": {"sampling.max_new_tokens": 4}}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_train_log(out: Path, arm: str, steps: list[float], decode_width: float, m: int) -> None:
    """One train_log line per step: its phase times sum to the given seconds (0.01 of them in the
    update, the rest in generation), and each of its rows decoded `decode_width` steps."""
    import json

    folder = out / "runs" / arm
    folder.mkdir(parents=True)
    rows = 8 if arm.startswith("grpo_n4") else 16
    lines = [
        {
            "time_gen_s": seconds - 0.01,
            "time_reward_s": 0.0,
            "time_select_s": 0.0,
            "time_update_s": 0.01,
            "time_sync_s": 0.0,
            "decode_steps": decode_width,
            "decode_sequence_steps": rows * decode_width,
            "micro_batches": 1,
            "rollouts_generated": rows,
            "completion_len_mean": decode_width,
            "update_tokens": 2 * m * 30,
            "prompts_kept": 2,
            "m": m,
        }
        for seconds in steps
    ]
    (folder / "train_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_validation_rows_predict_held_out_arms_from_the_config_and_recompute_the_error(tmp_path):
    from pods_bench.planning.profile import arm_configs, validation_markdown, validation_rows
    from pods_bench.planning.step_time import StepLengths, StepTimeModel

    out = tmp_path / "profile"
    arms = arm_configs(held_out_experiment(tmp_path), out)
    # the fitted arms' completions ran to their limit of 8; the held-out new4 arm's stopped at 3 of its 4
    write_train_log(out, "grpo_n4_m4", [0.05, 0.06024], decode_width=8, m=4)  # measured 0.05512
    write_train_log(out, "pods_n8_m2", [0.09, 0.1, 0.11], decode_width=8, m=2)  # 0.1
    write_train_log(out, "grpo_n8_m8", [0.11, 0.13], decode_width=8, m=8)  # 0.12
    write_train_log(out, "grpo_n4_m4_new4", [0.025, 0.035], decode_width=3, m=4)  # 0.03
    # a model whose step is 1 ms per decoded row-step (HF generate: rows x the call's longest completion),
    # fitted where calls decoded 6 steps: from the config an arm decodes 6, or its limit if lower
    phases = {"gen": {"decode_sequence_steps": 0.001}, "reward": {}, "select": {}, "update": {}, "sync": {}}
    model = StepTimeModel(phases, "by hand", StepLengths(6.0, 5.0, 30.0))
    rows = validation_rows(out, arms, model, ["grpo_n4_m4", "pods_n8_m2"])

    # P = 2 prompts: 8 rows at n = 4, 16 at n = 8. From the config: 8 x 6 ms = 0.048, 16 x 6 ms = 0.096,
    # the new4 arm 8 x 4 ms = 0.032 (its limit); from its own lengths 8 x 8 ms, 16 x 8 ms, 8 x 3 ms.
    # Errors relative to the measurement: (0.048 - 0.05512) / 0.05512 = -12.9 %, (0.096 - 0.12) / 0.12
    # = -20 % (over the prediction it would read -25 %), (0.032 - 0.03) / 0.03 = +6.7 %
    assert rows == [
        {"arm": "grpo_n4_m4", "n": 4, "m": 4, "role": "fitted", "steps": 2, "measured_s": 0.0551,
         "predicted_s": 0.048, "error_pct": -12.9, "predicted_own_lengths_s": 0.064, "error_own_lengths_pct": 16.1},
        {"arm": "pods_n8_m2", "n": 8, "m": 2, "role": "fitted", "steps": 3, "measured_s": 0.1,
         "predicted_s": 0.096, "error_pct": -4.0, "predicted_own_lengths_s": 0.128, "error_own_lengths_pct": 28.0},
        {"arm": "grpo_n8_m8", "n": 8, "m": 8, "role": "held out: n, m", "steps": 2, "measured_s": 0.12,
         "predicted_s": 0.096, "error_pct": -20.0, "predicted_own_lengths_s": 0.128, "error_own_lengths_pct": 6.7},
        {"arm": "grpo_n4_m4_new4", "n": 4, "m": 4, "role": "held out: sampling.max_new_tokens=4", "steps": 2,
         "measured_s": 0.03, "predicted_s": 0.032, "error_pct": 6.7, "predicted_own_lengths_s": 0.024,
         "error_own_lengths_pct": -20.0},
    ]  # fmt: skip
    assert validation_markdown(rows).splitlines()[4:] == [
        "| grpo_n8_m8 | 8/8 | held out: n, m | 2 | 0.12 | 0.096 | -20.0 % | 0.128 | +6.7 % |",
        "| grpo_n4_m4_new4 | 4/4 | held out: sampling.max_new_tokens=4 | 2 | 0.03 | 0.032 | +6.7 % | 0.024 | -20.0 % |",
    ]
    # the tables keep 4 decimals of a second: a coefficient 0.037 % higher moves only the 5th
    nearly = StepTimeModel({**phases, "gen": {"decode_sequence_steps": 0.00100037}}, "", StepLengths(6.0, 5.0, 30.0))
    rounded = lambda rows: [(r["predicted_s"], r["predicted_own_lengths_s"]) for r in rows]
    assert rounded(validation_rows(out, arms, nearly, ["grpo_n4_m4", "pods_n8_m2"])) == rounded(rows)


def test_the_model_is_fitted_on_the_fitted_arms_runs_alone_and_checked_on_every_arm(tmp_path):
    import json

    from pods_bench.io import read_jsonl
    from pods_bench.planning.profile import arm_configs, fit_and_validate, validation_markdown, validation_rows
    from pods_bench.planning.step_time import StepLengths, fit
    from pods_bench.run_info import hardware

    config, out = held_out_experiment(tmp_path), tmp_path / "profile"
    arms = arm_configs(config, out)
    write_train_log(out, "grpo_n4_m4", [0.05, 0.06], decode_width=8, m=4)
    write_train_log(out, "pods_n8_m2", [0.09, 0.1, 0.11], decode_width=8, m=2)
    write_train_log(out, "grpo_n8_m8", [0.4, 0.5], decode_width=8, m=8)
    write_train_log(out, "grpo_n4_m4_new4", [0.025, 0.035], decode_width=3, m=4)
    fitted = ["grpo_n4_m4", "pods_n8_m2"]
    model, rows = fit_and_validate(config, out, arms, fitted)

    logs = {arm: read_jsonl(out / "runs" / arm / "train_log.jsonl") for arm in arms}
    pooled = logs["grpo_n4_m4"] + logs["pods_n8_m2"]  # every step of the fitted arms, no other arm's
    every_arm = [r for log in logs.values() for r in log]
    assert model.coefficients == fit(pooled).coefficients != fit(every_arm).coefficients
    assert model.lengths == StepLengths.from_records(pooled)
    assert model.source == f"profile of {config} on {hardware()['label']}, fitted on grpo_n4_m4, pods_n8_m2"
    assert rows == validation_rows(out, arms, model, fitted)
    assert [r["role"] for r in rows] == ["fitted", "fitted", "held out: n, m", "held out: sampling.max_new_tokens=4"]
    assert json.loads((out / "step_time_model.json").read_text()) == json.loads(json.dumps(model.to_dict()))
    assert pd.read_csv(out / "validation.csv").to_dict("records") == rows
    assert (out / "validation.md").read_text() == validation_markdown(rows)


def test_the_arms_take_turns_each_round_up_to_their_share_of_the_steps():
    from pods_bench.planning.profile import interleaved_schedule

    arms = {"a": None, "b": None, "c": None}
    assert interleaved_schedule(arms, 12, 3) == [
        ("a", 4), ("b", 4), ("c", 4), ("a", 8), ("b", 8), ("c", 8), ("a", 12), ("b", 12), ("c", 12),
    ]  # fmt: skip
    # rounds that do not divide the steps: the floor of each round's share, the last round all of them
    assert interleaved_schedule({"a": None}, 5, 2) == [("a", 2), ("a", 5)]
    assert interleaved_schedule({"a": None}, 1, 1) == [("a", 1)]


def test_validation_and_memory_tables_are_written_as_csv_and_markdown(tmp_path):
    from pods_bench.planning.profile import memory_markdown, validation_markdown, write_rows

    rows = [
        {"arm": "a", "n": 8, "m": 2, "role": "fitted", "steps": 3, "measured_s": 0.5, "predicted_s": 0.45,
         "error_pct": -10.0, "predicted_own_lengths_s": 0.55, "error_own_lengths_pct": 10.0},
    ]  # fmt: skip
    write_rows(tmp_path, "validation", rows, validation_markdown)
    assert pd.read_csv(tmp_path / "validation.csv").to_dict("records") == rows
    assert (tmp_path / "validation.md").read_text() == (
        "| arm | n/m | role | steps | measured s/step | predicted (config) | error | predicted (own lengths) | error |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
        "| a | 8/2 | fitted | 3 | 0.5 | 0.45 | -10.0 % | 0.55 | +10.0 % |\n"
    )
    memory = [
        {"arm": "b", "n": 16, "m": 4, "rows": 8, "prompt_tokens": 100, "completion_tokens": 32,
         "measured_mib": 12.5, "planned_mib": 13.0, "error_pct": 4.0},
    ]  # fmt: skip
    assert memory_markdown(memory) == (
        "| arm | n/m | rows x (prompt + completion) | measured MiB | planned MiB | error |\n"
        "| --- | --- | --- | --- | --- | --- |\n"
        "| b | 16/4 | 8 x (100 + 32) | 12.5 | 13.0 | +4.0 % |\n"
    )


def test_arm_configs_are_the_workflow_arms_with_the_profile_settings(tmp_path, monkeypatch):
    from pods_bench.errors import PodsBenchError
    from pods_bench.planning.profile import arm_configs, profile, profile_arms

    config, out = held_out_experiment(tmp_path), tmp_path / "profile"
    arms = arm_configs(config, out)
    assert list(arms) == ["grpo_n4_m4", "pods_n8_m2", "grpo_n8_m8", "grpo_n4_m4_new4"]
    settings, overrides, changes = arms["grpo_n4_m4_new4"]
    assert settings["prompts_per_step"] == 2 and settings["device"] == "cpu"
    # the arm's own settings, then its run folder, the first seed, no time limit, one checkpoint a run
    # (1e12 s apart: only where a round ends) and no inline evaluation
    assert overrides == [
        "arm=grpo_n4_m4_new4", "selection.rule=all", "selection.n=4", "selection.m=4",
        "sampling.max_new_tokens=4", f"output_dir={out / 'runs' / 'grpo_n4_m4_new4'}", "seed=0",
        "budget.max_train_time_s=null", "budget.checkpoint_every_s=1000000000000.0", "eval.inline=false",
    ]  # fmt: skip
    assert changes == "sampling.max_new_tokens=4" and arms["grpo_n8_m8"][2] == ""

    experiment = yaml.safe_load(config.read_text())
    experiment["seeds"] = [7, 3]
    experiment["arms"]["grpo_n4_m4"]["set"] = {"optim.micro_batch_size": 4, "sampling.temperature": 0.5}
    config.write_text(yaml.safe_dump(experiment, sort_keys=False))
    settings, overrides, changes = arm_configs(config, out)["grpo_n4_m4"]
    assert "seed=7" in overrides and changes == "optim.micro_batch_size=4, sampling.temperature=0.5"

    # a warm start that is not built yet stops before anything runs (unless the model is not needed)
    experiment["warm_start"] = {"enabled": True, "name": "not-built-yet"}
    config.write_text(yaml.safe_dump(experiment, sort_keys=False))
    with pytest.raises(PodsBenchError) as error:
        arm_configs(config, out)
    # the same folder twice: the one missing and the one to build
    assert re.fullmatch(
        r"the warm-started model (\S+/not-built-yet) does not exist yet: run `pods-bench pretrain --out \1`",
        str(error.value),
    )
    assert len(arm_configs(config, out, check_model=False)) == 4
    monkeypatch.chdir(tmp_path)  # the warm start's folder is relative to where the workflow runs
    built = Path(re.fullmatch(r"the warm-started model (\S+) does not.*", str(error.value)).group(1))
    built.mkdir(parents=True)
    (built / "config.json").write_text("{}")  # what a built model folder has: the check passes
    assert len(arm_configs(config, out)) == 4
    # no warm start and no model section: the trainer's default model, nothing to check
    experiment["warm_start"] = {"enabled": False}
    del experiment["train"]["model"]
    config.write_text(yaml.safe_dump(experiment, sort_keys=False))
    assert all("model" not in settings for settings, _, _ in arm_configs(config, out).values())
    experiment["train"]["model"] = {"dtype": "float32"}  # a model section without a name: the same
    config.write_text(yaml.safe_dump(experiment, sort_keys=False))
    assert len(arm_configs(config, out)) == 4

    experiment["warm_start"] = {"enabled": False}
    experiment["hardware"] = "cpu_ddp"
    config.write_text(yaml.safe_dump(experiment, sort_keys=False))
    with pytest.raises(PodsBenchError) as error:
        arm_configs(config, out)
    assert str(error.value) == "pods-bench profile times one process; choose a one-process hardware setup"

    # bad arguments stop before any arm is trained
    experiment["hardware"] = "cpu"
    config.write_text(yaml.safe_dump(experiment, sort_keys=False))
    with pytest.raises(PodsBenchError) as error:
        profile(config, out, ["grpo_n4_m4", "nope"], 12, 3)
    assert str(error.value) == (
        f"--fit: no arm 'nope' in {config}; choose from grpo_n4_m4, pods_n8_m2, grpo_n8_m8, grpo_n4_m4_new4"
    )
    for steps, rounds in [(1, 2), (0, 0)]:
        with pytest.raises(PodsBenchError) as error:
            profile(config, out, None, steps, rounds)
        assert str(error.value) == f"--steps ({steps}) must be >= --rounds ({rounds}) >= 1"
    assert not (out / "runs").exists()
    # the smallest accepted: one round, as many steps as rounds; every arm fitted unless told otherwise
    arms, fitted = profile_arms(config, out, None, 1, 1)
    assert fitted == list(arms) == ["grpo_n4_m4", "pods_n8_m2", "grpo_n8_m8", "grpo_n4_m4_new4"]
    assert profile_arms(config, out, ["pods_n8_m2"], 2, 2)[1] == ["pods_n8_m2"]
