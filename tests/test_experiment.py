"""An experiment config turned into jobs (pods_bench/experiment.py), without Snakemake: resources per
hardware setup, the training launch line, the run markers, and the one-line errors the workflow
prints (tests/test_bad_input.py checks the same lines end to end)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import typing

import pytest
import yaml

from pods_bench import experiment
from pods_bench import workflow_jobs as jobs
from pods_bench.errors import PodsBenchError
from pods_bench.typed_config import config_key, json_schema
from tests.test_workflow import CONFIG_DIR, PROJECT_ROOT


def loaded(name: str, hardware: str | None = None) -> tuple[experiment.Experiment, dict, dict]:
    """(experiment, hardware setup, arm -> resolved trainer config) of config/<name>.yaml, optionally
    on another setup of config/hardware.yaml."""
    config, setup = experiment.load_experiment(CONFIG_DIR / f"{name}.yaml")
    if hardware:
        config.hardware, setup = hardware, experiment.hardware_setup(hardware)
    return config, setup, experiment.resolve_runs(config, setup)[1]


def raw(name: str) -> dict:
    """config/<name>.yaml as written (no schema defaults)."""
    return yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())


# --- resources ------------------------------------------------------------------------------------


def test_resources_of_a_gpu_setup():
    config, setup, arms = loaded("h100x8")
    train = jobs.job_resources("train", setup, config.resources, arms["pods_n128_m32"])
    # 30 minutes of budget x 1.5 + 60 minutes of start-up, on the setup's 8 H100s
    assert train == {"mem_mb": 512000, "runtime": 105, "cpus_per_task": 64, "gpu": 8, "gpu_model": "h100"}
    evaluate = jobs.job_resources("evaluate", setup, config.resources)
    assert evaluate == {"mem_mb": 64000, "runtime": 120, "cpus_per_task": 8, "gpu": 1, "gpu_model": "h100"}


def test_resources_of_the_cpu_setup_name_no_gpu_model():
    config, setup, arms = loaded("smoke")
    train = jobs.job_resources("train", setup, config.resources, arms["grpo_n16_m16"])
    # the budget's cap, 900 s, x 3.0 + 10 minutes
    assert train == {"mem_mb": 3000, "runtime": 55, "cpus_per_task": 1, "gpu": 0}


def test_runtime_follows_the_budget_times_the_factor_plus_the_overhead():
    config, setup, arms = loaded("gsm8k_main")
    arm = arms["pods_n64_m16"]
    assert arm.budget.max_train_time_s == 21600
    # L40S: 360 minutes x 1.25 + 60
    assert jobs.job_resources("train", setup, config.resources, arm)["runtime"] == 510


def test_the_config_resources_replace_the_setup():
    config, setup, arms = loaded("gsm8k_main")
    resources = {"evaluate": {"runtime_min": 600}, "train": {"runtime_min": 30, "mem_mb": 1000}}
    assert jobs.job_resources("evaluate", setup, resources)["runtime"] == 600
    train = jobs.job_resources("train", setup, resources, arms["pods_n64_m16"])
    assert (train["runtime"], train["mem_mb"], train["gpu_model"]) == (30, 1000, "l40s")


def test_a_budget_without_time_needs_a_runtime():
    config, setup, arms = loaded("smoke")
    arm = copy.deepcopy(arms["grpo_n16_m16"])
    arm.budget.max_train_time_s = None
    with pytest.raises(PodsBenchError) as e:
        jobs.job_resources("train", setup, config.resources, arm)
    assert str(e.value) == "config key resources.train.runtime_min is needed: the budget has no max_train_time_s"


# --- launching training ----------------------------------------------------------------------------


def test_one_process_runs_the_package():
    _, setup, arms = loaded("smoke")
    assert jobs.train_launcher(setup, arms["pods_n16_m8"]) == "python -m pods_bench"


def test_several_processes_go_through_accelerate():
    _, setup, arms = loaded("h100x8")
    assert jobs.train_launcher(setup, arms["pods_n128_m32"]) == (
        "accelerate launch --num_processes 8 --num_machines 1 --mixed_precision bf16 --dynamo_backend no "
        "--multi_gpu -m pods_bench"
    )
    # the CPU setup with two processes: the same launcher, the trainer's own mixed precision
    _, setup, arms = loaded("smoke", hardware="cpu_ddp")
    line = jobs.train_launcher(setup, arms["pods_n16_m8"])
    assert line.startswith("accelerate launch --num_processes 2 --num_machines 1 ") and "--multi_gpu" in line


def test_an_accelerate_config_replaces_plain_data_parallel():
    _, setup, arms = loaded("h100x8")
    setup = {**setup, "accelerate_config": "config/accelerate/zero2.yaml"}
    assert jobs.train_launcher(setup, arms["pods_n128_m32"], root=PROJECT_ROOT) == (
        f"accelerate launch --config_file {PROJECT_ROOT / 'config/accelerate/zero2.yaml'} --num_processes 8 "
        "--num_machines 1 --mixed_precision bf16 --dynamo_backend no -m pods_bench"
    )


def test_set_flags_are_quoted_for_the_shell():
    assert jobs.set_flags(["seed=1", "task.system_prompt=Think step by step."]) == (
        "--set seed=1 --set 'task.system_prompt=Think step by step.'"
    )


# --- the run grid ----------------------------------------------------------------------------------


def test_a_run_is_finished_by_its_evaluation_or_by_inline_training():
    config, _, arms = loaded("gsm8k_main")
    assert jobs.finished_run(config, "pods_n64_m16", 3, arms["pods_n64_m16"]) == (
        "results/gsm8k_main/runs/pods_n64_m16/seed3/eval.done"
    )
    for name, arm, seed in [("h100x8", "grpo_n32_m32", 21), ("smoke", "pods_n16_m8", 3)]:
        config, _, arms = loaded(name)  # evaluated inline: no evaluation job
        assert jobs.finished_run(config, arm, seed, arms[arm]) == f"results/{name}/runs/{arm}/seed{seed}/train.done"


def test_a_seed_waits_for_every_arm_of_the_seed_before_it():
    config, _, _ = loaded("smoke")  # seeds [0, 1, 2, 3], pair_seeds by default
    assert config.pair_seeds is True
    assert jobs.previous_seed_runs(config, 0) == []
    assert jobs.previous_seed_runs(config, "3") == [("grpo_n16_m16", 2), ("pods_n16_m8", 2)]
    config.seeds = [7, 2]  # the order of `seeds`, not their values
    assert jobs.previous_seed_runs(config, 2) == [("grpo_n16_m16", 7), ("pods_n16_m8", 7)]
    config.pair_seeds = False
    assert jobs.previous_seed_runs(config, 2) == []


def test_analysis_options():
    analysis = experiment.AnalysisChoices(baseline="grpo", benchmark="gsm8k", metric="answer_acc", bootstrap=1000)
    assert jobs.analysis_options(analysis, "aggregate") == (
        "--baseline grpo --benchmark gsm8k --metric answer_acc --bootstrap 1000"
    )
    assert jobs.analysis_options(analysis, "plot") == "--baseline grpo --benchmark gsm8k --metric answer_acc"


def test_the_published_logs_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("PODS_BENCH_PAPER_LOGS", raising=False)
    config = experiment.Experiment.from_config({**raw("smoke"), "paper_logs": "logs"})
    assert jobs.paper_logs_dir(config, root=tmp_path) == str(tmp_path / "logs")
    monkeypatch.setenv("PODS_BENCH_PAPER_LOGS", str(tmp_path / "elsewhere"))
    assert jobs.paper_logs_dir(config, root=tmp_path) == str(tmp_path / "elsewhere")


# --- one-line errors -------------------------------------------------------------------------------


def test_the_paper_configs_follow_the_schema():
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        if path.stem not in ("hardware", "models"):
            assert experiment.schema_error(raw(path.stem)) is None, path.name


def test_the_schema_file_is_written_from_the_experiment_classes():
    """Each experiment key is declared once, in pods_bench/experiment.py; the schema Snakemake checks
    is written from it, and an edit of either alone fails here."""
    assert experiment.SCHEMA.read_text(encoding="utf-8") == experiment.schema_text(), (
        "run `python -m pods_bench.experiment --write-schema`"
    )


@dataclasses.dataclass
class SchemaInner:
    k: int = config_key(minimum=1)


@dataclasses.dataclass
class SchemaOuter:
    name: str = config_key(description="a name", pattern="^a")
    ids: list[int] = config_key(default_factory=list, items={"minimum": 0}, minItems=1)
    rate: float | None = config_key(None, exclusiveMinimum=0)
    mode: typing.Literal["x", "y"] | None = None
    inner: SchemaInner | None = None
    plain: dict[str, typing.Any] = config_key(default_factory=dict, schema={"type": "object", "maxProperties": 2})


def test_a_dataclass_becomes_the_json_schema_of_its_keys():
    """typed_config.json_schema on a small class, the schema worked out by hand: required keys are
    those without a default, `X | None` adds null (a section that may be null is anyOf null first),
    Literal is an enum, and `config_key(...)` adds the description and limits (list items' limits merged)."""
    assert json_schema(SchemaOuter) == {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "name": {"description": "a name", "type": "string", "pattern": "^a"},
            "ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1, "default": []},
            "rate": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": None},
            "mode": {"type": ["string", "null"], "enum": ["x", "y", None], "default": None},
            "inner": {
                "anyOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["k"],
                        "properties": {"k": {"type": "integer", "minimum": 1}},
                    },
                ],
                "default": None,
            },
            "plain": {"type": "object", "maxProperties": 2, "default": {}},
        },
    }


def test_the_experiment_defaults_are_those_snakemake_fills_in():
    """Experiment's defaults equal those Snakemake's `validate` fills in from the written schema, on
    every experiment config, with an arm that leaves `set` out and a config that leaves out whole
    sections."""
    from snakemake.utils import validate

    configs = [raw(p.stem) for p in sorted(CONFIG_DIR.glob("*.yaml")) if p.stem not in ("hardware", "models")]
    bare = {
        k: v
        for k, v in raw("smoke").items()
        if k in ("experiment", "hardware", "seeds", "benchmark", "eval_benchmarks", "arms")
    }
    for config in [*configs, bare]:
        by_snakemake = copy.deepcopy(config)
        validate(by_snakemake, str(experiment.SCHEMA))
        assert experiment.Experiment.from_config(config).to_dict() == by_snakemake, config["experiment"]
    typed = experiment.Experiment.from_config(bare)
    assert typed.arms["pods_n16_m8"].set == {} and typed.pair_seeds is True  # defaults at two levels
    assert "pair_seeds" not in bare


def test_plan_reads_an_experiment_without_snakemake(tmp_path):
    """`pods-bench plan` (and `profile`, `project`) read experiment configs through load_experiment:
    it works where Snakemake cannot be imported, and a schema mistake is its one line."""
    script = (
        "import sys; sys.modules['snakemake'] = None  # any import of snakemake now fails\n"
        "from pods_bench.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    command = [sys.executable, "-c", script, "plan", str(CONFIG_DIR / "smoke.yaml"), "--out", str(tmp_path / "p.csv")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "p.csv").stat().st_size > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**raw("smoke"), "epochs": 3}))
    done = subprocess.run([*command[:4], str(bad)], capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "unknown config key epochs" in done.stderr


def test_schema_error_lines_name_the_key():
    config = raw("smoke")
    config["arms"]["pods_n16_m8"]["k"] = 2
    assert experiment.schema_error(config) == "unknown config key arms.pods_n16_m8.k (allowed here: m, n, rule, set)"
    config = raw("smoke")
    del config["benchmark"]
    assert experiment.schema_error(config) == "missing config key benchmark"
    config = raw("smoke")
    config["arms"]["pods_n16_m8"]["n"] = 1
    assert experiment.schema_error(config) == "config key arms.pods_n16_m8.n: 1 is less than the minimum of 2"
    # a section that may also be null: the mistake inside it, or what it may be
    config["arms"]["pods_n16_m8"]["n"] = 16
    config["budget_in_baseline_steps"] = {"step": 3}
    assert experiment.schema_error(config) == (
        "unknown config key budget_in_baseline_steps.step (allowed here: checkpoints, side_by_side, steps, timed_steps)"
    )
    config["budget_in_baseline_steps"] = 60
    assert experiment.schema_error(config) == "config key budget_in_baseline_steps must be null or a mapping, got 60"


def test_strings_from_the_command_line_get_a_hint():
    config = {**raw("smoke"), "seeds": ["0", "1"]}
    # of the same mistake at several places, the first is named
    assert experiment.schema_error(config) == "config key seeds[0] must be integer, got the string '0'"
    assert experiment.schema_error(config, command_line_keys={"seeds": "[0,1]"}) == (
        "config key seeds[0] must be integer, got the string '0' "
        "(--config passes lists and mappings as strings: put them in a --configfile)"
    )


def test_unknown_hardware_and_benchmarks():
    with pytest.raises(PodsBenchError) as e:
        experiment.hardware_setup("tpu-pod")
    assert str(e.value) == (
        "config key hardware: unknown setup 'tpu-pod'; choose from cpu, cpu_ddp, l40s, h200, h100x8, a100x8 (config/hardware.yaml)"
    )
    config, _, _ = loaded("smoke")
    config.eval_benchmarks = ["arith", "gsm9k"]
    with pytest.raises(PodsBenchError) as e:
        experiment.check_benchmarks(config)
    assert str(e.value).startswith("config key eval_benchmarks[1]: unknown task 'gsm9k'")


def test_trainer_mistakes_name_train_or_the_arm():
    config, setup, _ = loaded("smoke")
    bad = copy.deepcopy(config)
    bad.train["optim"]["lrr"] = 1.0
    with pytest.raises(PodsBenchError, match=r"^train: unknown config key optim.lrr \(did you mean optim.lr\?\)$"):
        experiment.resolve_runs(bad, setup)
    bad = copy.deepcopy(config)
    bad.arms["pods_n16_m8"].m = 32
    with pytest.raises(
        PodsBenchError, match=r"^arms.pods_n16_m8: config key selection.m \(32\) must be <= selection.n \(16\)$"
    ):
        experiment.resolve_runs(bad, setup)
    bad = copy.deepcopy(config)
    bad.arms["pods_n16_m8"].set = {"seed": 3}
    with pytest.raises(
        PodsBenchError, match=r"^config key arms.pods_n16_m8.set.seed is set by the workflow: use seeds instead$"
    ):
        experiment.resolve_runs(bad, setup)


def test_one_address_book_for_the_experiment_layout():
    """The run folder the workflow's jobs write (the experiment's layout, the train rule's marker) and the
    trainer's default output_dir are the same path, spelled once (pods_bench/layout.py)."""
    from pods_bench.config import config_from_dict
    from pods_bench.layout import ExperimentLayout

    config, _, arms = loaded("smoke")
    where = ExperimentLayout("smoke")
    assert (
        config.layout.run("pods_n16_m8", 3) == where.run("pods_n16_m8", 3) == ("results/smoke/runs/pods_n16_m8/seed3")
    )
    default = config_from_dict({"experiment": "smoke", "arm": "pods_n16_m8", "seed": 3, "budget": {"max_steps": 1}})
    assert default.output_dir == where.run("pods_n16_m8", 3)
    assert where.train_done("{arm}", "{seed}") == "results/smoke/runs/{arm}/seed{seed}/train.done"
    assert experiment.warm_start_dir(config) == "results/warm_start/arith-tiny"


def test_several_warm_starts_share_out_the_run_seeds():
    config, _, _ = loaded("strategies")  # warm_start.seeds [0, 1]
    assert experiment.warm_start_folders(config) == {"arith-tiny": 0, "arith-tiny-seed1": 1}
    starts = [experiment.warm_start_dir(config, seed) for seed in config.seeds]
    assert starts == ["results/warm_start/arith-tiny", "results/warm_start/arith-tiny-seed1"] * 4
    assert "model.name=results/warm_start/arith-tiny-seed1" in experiment.run_overrides(config, "grpo_n16_m16", 3)
    # one warm start: the shared settings name it and no run overrides it
    smoke, _, _ = loaded("smoke")
    assert experiment.warm_start_folders(smoke) == {"arith-tiny": 0}
    assert not any(item.startswith("model.name=") for item in experiment.run_overrides(smoke, "grpo_n16_m16", 1))


def test_more_warm_starts_than_run_seeds_is_one_line():
    config = raw("strategies")
    config.update(seeds=[0], warm_start={"enabled": True, "name": "arith-tiny", "seeds": [0, 1]})
    with pytest.raises(
        PodsBenchError, match=r"^config key warm_start.seeds: 2 warm starts need at least as many run seeds, got 1$"
    ):
        experiment.Experiment.from_config(config)
