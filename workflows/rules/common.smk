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

# Trainer keys the workflow sets itself, and the experiment-config key to use instead.
WORKFLOW_KEYS = {
    "experiment": "experiment",
    "arm": "arms",
    "seed": "seeds",
    "output_dir": "experiment (runs go to results/<experiment>/runs/<arm>/seed<k>)",
    "device": "hardware",
    "task.name": "benchmark",
    "eval.benchmarks": "eval_benchmarks",
    "selection.rule": "arms.<arm>.rule",
    "selection.n": "arms.<arm>.n",
    "selection.m": "arms.<arm>.m",
}


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

from pods_bench.config import config_from_dict

WARM_START = config["warm_start"]
WARM_START_DIR = f"results/warm_start/{WARM_START['name']}"


def _flatten(data: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _reject_workflow_keys(keys, where: str) -> None:
    for key in keys:
        owner = WORKFLOW_KEYS.get(key)
        if owner:
            config_error(f"config key {where}{key} is set by the workflow: use {owner} instead")


def _merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def _train_base() -> dict:
    if not config["train_base"]:
        return {}
    path = ROOT / config["train_base"]
    try:
        base = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        config_error(f"config key train_base: cannot read {config['train_base']} ({str(e).splitlines()[0]})")
    if not isinstance(base, dict):
        config_error(f"config key train_base: {config['train_base']} must hold a mapping of trainer settings")
    _reject_workflow_keys(_flatten(base), f"{config['train_base']}: ")
    return base


def shared_train_settings() -> dict:
    """The trainer config every arm starts from (written to results/<experiment>/configs/train.yaml):
    `train_base`, then `train` merged over it, then what the workflow sets."""
    _reject_workflow_keys(_flatten(config["train"]), "train.")
    settings = json.loads(json.dumps(_merge(_train_base(), config["train"])))  # plain data, a deep copy
    settings["experiment"] = EXPERIMENT
    settings["device"] = HARDWARE["device"]
    settings.setdefault("task", {})["name"] = config["benchmark"]
    settings.setdefault("eval", {})["benchmarks"] = list(config["eval_benchmarks"])
    if WARM_START["enabled"]:
        settings.setdefault("model", {})["name"] = WARM_START_DIR
    return settings


def _set_value(value) -> str:
    """A value as the trainer's `--set key=value` reads it (strings raw, everything else YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def arm_overrides(arm: str) -> list[str]:
    """The `--set` items that make the shared settings into arm `arm`."""
    spec = config["arms"][arm]
    _reject_workflow_keys(spec["set"], f"arms.{arm}.set.")
    items = [f"arm={arm}", f"selection.rule={spec['rule']}", f"selection.n={spec['n']}", f"selection.m={spec['m']}"]
    return items + [f"{key}={_set_value(value)}" for key, value in spec["set"].items()]


def run_dir(arm, seed) -> str:
    return f"{RUNS_DIR}/{arm}/seed{seed}"


def run_overrides(arm, seed) -> list[str]:
    return arm_overrides(arm) + [f"seed={seed}", f"output_dir={run_dir(arm, seed)}"]


TRAIN_SETTINGS = shared_train_settings()
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
