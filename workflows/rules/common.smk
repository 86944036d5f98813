# The experiment config, checked before any job starts, and the grid it defines.
#
# Order of the checks, each failing with one line that names the key:
#   1. the JSON schema (workflows/schemas/config.schema.yaml): types, unknown keys, seeds as integers;
#   2. the hardware setup exists (config/hardware.yaml) and the benchmarks are known tasks;
#   3. the trainer's own config loader accepts the shared `train` settings and every arm.
# Snakemake's `validate` then fills in the schema's defaults.

import json
import math
import os
import re
import shlex
import sys
from pathlib import Path

import yaml
from snakemake.utils import validate

ROOT = Path(workflow.basedir)
SCHEMA = ROOT / "workflows" / "schemas" / "config.schema.yaml"
HARDWARE_FILE = ROOT / "config" / "hardware.yaml"
ENVIRONMENT = str(ROOT / "environment.yml")
CONFIG_FILES = [str(p) for p in workflow.overwrite_configfiles] or [str(ROOT / "config" / "smoke.yaml")]

# Jobs run `python -m pods_bench` and `accelerate` from the environment snakemake itself runs in (a
# venv need not be activated), and import pods_bench from this source tree (so `--sdm conda` works
# with environment.yml alone).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
PODS_BENCH = "python -m pods_bench"

def config_error(message: str):
    """Bad input: one line naming the key, then exit before any job starts."""
    print(f"pods-bench workflow: {', '.join(CONFIG_FILES)}: {message}", file=sys.stderr)
    sys.exit(2)


def _key(path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top level>"


def _schema_error_line(error) -> str:
    """jsonschema's error as one line naming the offending key."""
    key = _key(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        where = f"{key}." if error.absolute_path else ""
        return f"unknown config key {where}{unknown[0]} (allowed here: {', '.join(allowed)})"
    if error.validator == "required":
        missing = error.message.split("'")[1]
        where = f"{key}." if error.absolute_path else ""
        return f"missing config key {where}{missing}"
    if error.validator == "type" and isinstance(error.instance, str):
        message = f"config key {key} must be {error.validator_value}, got the string {error.instance!r}"
        if error.absolute_path and error.absolute_path[0] in workflow.config_settings.config:
            # `--config seeds=[0,1]` reaches the workflow as strings
            message += " (--config passes lists and mappings as strings: put them in a --configfile)"
        return message
    if error.validator == "propertyNames":
        return f"config key {key}: name {error.instance!r} is not allowed ({error.message})"
    return f"config key {key}: {error.message}"


def check_schema(cfg: dict) -> None:
    import jsonschema

    schema = yaml.safe_load(SCHEMA.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = list(validator.iter_errors(cfg))
    best = jsonschema.exceptions.best_match(errors)
    if best is not None:
        # of the same mistake at several places (seeds[0], seeds[1], ...), name the first
        parent = list(best.absolute_path)[:-1]
        same = [e for e in errors if e.validator == best.validator and list(e.absolute_path)[:-1] == parent]
        first = min(same, key=lambda e: [(isinstance(p, str), p) for p in e.absolute_path])
        config_error(_schema_error_line(first))
    validate(cfg, str(SCHEMA))  # fills in the defaults


check_schema(config)
EXPERIMENT = config["experiment"]
EXP_DIR = f"results/{EXPERIMENT}"
RUNS_DIR = f"{EXP_DIR}/runs"
SUMMARY_DIR = f"{EXP_DIR}/summary"
FIGURES_DIR = f"figures/{EXPERIMENT}"
LOG_DIR = f"{EXP_DIR}/logs"
BENCHMARK_DIR = f"{EXP_DIR}/benchmarks"

# --- hardware ------------------------------------------------------------------------------------

HARDWARE_SETUPS = yaml.safe_load(HARDWARE_FILE.read_text())
if config["hardware"] not in HARDWARE_SETUPS:
    config_error(f"config key hardware: unknown setup {config['hardware']!r}; "
                 f"choose from {', '.join(HARDWARE_SETUPS)} (config/hardware.yaml)")
HARDWARE = HARDWARE_SETUPS[config["hardware"]]

# --- benchmarks ----------------------------------------------------------------------------------

from pods_bench.errors import PodsBenchError
from pods_bench.tasks import get_task

for key, name in [("benchmark", config["benchmark"])] + [
    (f"eval_benchmarks[{i}]", b) for i, b in enumerate(config["eval_benchmarks"])
]:
    try:
        get_task(name)
    except PodsBenchError as e:
        config_error(f"config key {key}: {e}")

# --- trainer settings ----------------------------------------------------------------------------

from pods_bench import experiment as experiment_settings  # how runs are built (also used by the tests)
from pods_bench.config import config_from_dict

WARM_START = config["warm_start"]
WARM_START_DIR = experiment_settings.warm_start_dir(config)


def run_dir(arm, seed) -> str:
    return experiment_settings.run_dir(config, arm, seed)


def run_overrides(arm, seed) -> list[str]:
    try:
        return experiment_settings.run_overrides(config, arm, seed)
    except PodsBenchError as e:
        config_error(str(e))


try:
    TRAIN_SETTINGS = experiment_settings.shared_train_settings(config, HARDWARE, ROOT)
except PodsBenchError as e:
    config_error(str(e))
try:
    config_from_dict(TRAIN_SETTINGS)
except PodsBenchError as e:
    config_error(f"train: {e}")
RESOLVED = {}  # arm -> the trainer config of its first seed, defaults filled in (for resources and the manifest)
for _arm in config["arms"]:
    try:
        RESOLVED[_arm] = config_from_dict(TRAIN_SETTINGS, run_overrides(_arm, config["seeds"][0]))
    except PodsBenchError as e:
        config_error(f"arms.{_arm}: {e}")

ARMS = list(config["arms"])
SEEDS = list(config["seeds"])
INLINE_EVAL = {arm: cfg.eval.inline for arm, cfg in RESOLVED.items()}

# --- resources -----------------------------------------------------------------------------------


def job_resources(rule: str, arm: str | None = None) -> dict:
    """Snakemake resources of one `rule` job ("train" or "evaluate") on this hardware."""
    spec = {**HARDWARE[rule], **config["resources"].get(rule, {})}
    if "runtime_min" in spec:
        runtime = spec["runtime_min"]
    else:  # training: the time budget, slowed down by the hardware's factor, plus start-up
        budget_s = RESOLVED[arm].budget.max_train_time_s
        if budget_s is None:
            config_error(f"config key resources.{rule}.runtime_min is needed: the budget has no max_train_time_s")
        runtime = math.ceil(budget_s / 60 * spec["runtime_factor"] + spec["runtime_overhead_min"])
    resources = {"mem_mb": spec["mem_mb"], "runtime": runtime, "cpus_per_task": spec["cpus"], "gpu": spec["gpu"]}
    if spec["gpu"] and HARDWARE.get("gpu_model"):
        resources["gpu_model"] = HARDWARE["gpu_model"]
    return resources


def train_launcher(arm: str) -> str:
    """One process, or the distributed engine (`accelerate launch`) with the setup's process count."""
    if HARDWARE["processes"] <= 1:
        return PODS_BENCH
    flags = [f"--num_processes {HARDWARE['processes']}", "--num_machines 1",
             f"--mixed_precision {RESOLVED[arm].model.mixed_precision}", "--dynamo_backend no"]
    if HARDWARE.get("accelerate_config"):
        flags.insert(0, f"--config_file {ROOT / HARDWARE['accelerate_config']}")
    else:  # torchrun's launcher; with device cpu the processes join a gloo group
        flags.append("--multi_gpu")
    return f"accelerate launch {' '.join(flags)} -m pods_bench"


def paper_logs_dir() -> str:
    """The published-logs folder: $PODS_BENCH_PAPER_LOGS, else `paper_logs` relative to the project root."""
    path = os.environ.get("PODS_BENCH_PAPER_LOGS") or config["paper_logs"]
    return str((ROOT / path).resolve())


wildcard_constraints:
    arm="|".join(re.escape(arm) for arm in ARMS),
    seed=r"\d+",
