"""An experiment config (config/<experiment>.yaml) turned into the trainer config of each run.

The workflow (workflows/rules/common.smk) and the conformance test (tests/test_fidelity.py) both
build runs this way, so what the paper configs claim is what the training jobs get:

    trainer config = train_base (a recipe file) <- `train` merged over it <- what the workflow owns
                     (experiment, device, task, evaluation benchmarks, warm-started model)
                     <- the arm's `--set` items (rule, n, m, its `set`) <- the run's (seed, output_dir)

Mistakes are a `PodsBenchError` with one line naming the key; the workflow prints it and stops.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pods_bench.errors import PodsBenchError

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflows" / "schemas" / "config.schema.yaml"
HARDWARE_FILE = ROOT / "config" / "hardware.yaml"

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


def flatten(data: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1} (empty mappings stay values)."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def merge(base: dict, update: dict) -> dict:
    """`update` merged into `base`, mappings key by key."""
    merged = dict(base)
    for key, value in update.items():
        merged[key] = merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def reject_workflow_keys(keys, where: str) -> None:
    for key in keys:
        owner = WORKFLOW_KEYS.get(key)
        if owner:
            raise PodsBenchError(f"config key {where}{key} is set by the workflow: use {owner} instead")


def warm_start_dir(config: dict) -> str:
    return f"results/warm_start/{config['warm_start']['name']}"


def runs_dir(config: dict) -> str:
    return f"results/{config['experiment']}/runs"


def _train_base(config: dict, root: Path) -> dict:
    if not config["train_base"]:
        return {}
    try:
        base = yaml.safe_load((root / config["train_base"]).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise PodsBenchError(f"config key train_base: cannot read {config['train_base']} ({str(e).splitlines()[0]})") from None
    if not isinstance(base, dict):
        raise PodsBenchError(f"config key train_base: {config['train_base']} must hold a mapping of trainer settings")
    reject_workflow_keys(flatten(base), f"{config['train_base']}: ")
    return base


def shared_train_settings(config: dict, hardware: dict, root: Path = ROOT) -> dict:
    """The trainer config every arm starts from (results/<experiment>/configs/train.yaml)."""
    reject_workflow_keys(flatten(config["train"]), "train.")
    settings = json.loads(json.dumps(merge(_train_base(config, root), config["train"])))  # plain data, a deep copy
    settings["experiment"] = config["experiment"]
    settings["device"] = hardware["device"]
    settings.setdefault("task", {})["name"] = config["benchmark"]
    settings.setdefault("eval", {})["benchmarks"] = list(config["eval_benchmarks"])
    if config["warm_start"]["enabled"]:
        settings.setdefault("model", {})["name"] = warm_start_dir(config)
    return settings


def _set_value(value) -> str:
    """A value as the trainer's `--set key=value` reads it (strings raw, everything else YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def arm_overrides(config: dict, arm: str) -> list[str]:
    """The `--set` items that make the shared settings into arm `arm`."""
    spec = config["arms"][arm]
    reject_workflow_keys(spec["set"], f"arms.{arm}.set.")
    items = [f"arm={arm}", f"selection.rule={spec['rule']}", f"selection.n={spec['n']}", f"selection.m={spec['m']}"]
    return items + [f"{key}={_set_value(value)}" for key, value in spec["set"].items()]


def run_dir(config: dict, arm: str, seed) -> str:
    return f"{runs_dir(config)}/{arm}/seed{seed}"


def run_overrides(config: dict, arm: str, seed) -> list[str]:
    return arm_overrides(config, arm) + [f"seed={seed}", f"output_dir={run_dir(config, arm, seed)}"]


def load_experiment(path: str | Path) -> tuple[dict, dict]:
    """(experiment config with the schema's defaults filled in, its hardware setup), outside Snakemake."""
    from snakemake.utils import validate

    config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    validate(config, str(SCHEMA))
    setups = yaml.safe_load(HARDWARE_FILE.read_text(encoding="utf-8"))
    if config["hardware"] not in setups:
        raise PodsBenchError(f"config key hardware: unknown setup {config['hardware']!r}")
    return config, setups[config["hardware"]]


def resolve_arms(path: str | Path) -> dict:
    """Arm -> the trainer config of its first seed, as the workflow's training job gets it."""
    from pods_bench.config import config_from_dict

    config, hardware = load_experiment(path)
    settings = shared_train_settings(config, hardware)
    return {arm: config_from_dict(settings, run_overrides(config, arm, config["seeds"][0])) for arm in config["arms"]}
