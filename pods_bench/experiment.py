"""An experiment config (config/<experiment>.yaml), read and checked: the schema's one-line
messages and defaults, the hardware setup, and the trainer config of each run. What each job asks
the scheduler for and runs is the workflow's adapter, pods_bench/workflow_jobs.py.

The workflow (workflows/rules/*.smk) and the tests (tests/test_fidelity.py, tests/test_experiment.py)
both build runs this way, so what the paper configs claim is what the training jobs get:

    trainer config = train_base (a recipe file) <- `train` merged over it <- what the workflow owns
                     (experiment, device, task, evaluation benchmarks, warm-started model)
                     <- the arm's `--set` items (rule, n, m, its `set`) <- the run's (seed, output_dir)

Mistakes are a `PodsBenchError` with one line naming the key; the workflow prints it and stops.
Nothing here reads Snakemake's state: what the workflow knows (the `--config` keys, the project
root) comes in as arguments.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import yaml

from pods_bench import layout
from pods_bench.config import config_from_dict, flatten
from pods_bench.errors import PodsBenchError
from pods_bench.layout import ExperimentLayout
from pods_bench.tasks import get_task

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


# --- checking an experiment config (each mistake one line naming the key) ---------------------------


def _key(path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top level>"


def schema_error_line(error, command_line_keys=()) -> str:
    """jsonschema's error as one line naming the offending key. `command_line_keys`: the top-level
    keys given with `--config` (Snakemake's `workflow.config_settings.config`)."""
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
        if error.absolute_path and error.absolute_path[0] in command_line_keys:
            # `--config seeds=[0,1]` reaches the workflow as strings
            message += " (--config passes lists and mappings as strings: put them in a --configfile)"
        return message
    if error.validator == "propertyNames":
        return f"config key {key}: name {error.instance!r} is not allowed ({error.message})"
    return f"config key {key}: {error.message}"


@functools.lru_cache(maxsize=4)
def read_schema(path: str | Path) -> dict:
    """The JSON schema, parsed once per process (load_experiment checks, then fills defaults)."""
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def schema_error(config: dict, command_line_keys=(), schema: str | Path = SCHEMA) -> str | None:
    """The line for the first mistake against the JSON schema, or None when the config follows it."""
    import jsonschema

    schema = read_schema(schema)
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = list(validator.iter_errors(config))
    best = jsonschema.exceptions.best_match(errors)
    if best is None:
        return None
    # of the same mistake at several places (seeds[0], seeds[1], ...), name the first
    parent = list(best.absolute_path)[:-1]
    same = [e for e in errors if e.validator == best.validator and list(e.absolute_path)[:-1] == parent]
    first = min(same, key=lambda e: [(isinstance(p, str), p) for p in e.absolute_path])
    return schema_error_line(first, command_line_keys)


def hardware_setup(name: str, hardware_file: str | Path = HARDWARE_FILE) -> dict:
    """Setup `name` of config/hardware.yaml."""
    setups = yaml.safe_load(Path(hardware_file).read_text(encoding="utf-8"))
    if name not in setups:
        raise PodsBenchError(
            f"config key hardware: unknown setup {name!r}; choose from {', '.join(setups)} (config/hardware.yaml)"
        )
    return setups[name]


def check_benchmarks(config: dict) -> None:
    """The training and evaluation benchmarks are tasks pods-bench knows."""
    for key, name in [("benchmark", config["benchmark"])] + [
        (f"eval_benchmarks[{i}]", b) for i, b in enumerate(config["eval_benchmarks"])
    ]:
        try:
            get_task(name)
        except PodsBenchError as e:
            raise PodsBenchError(f"config key {key}: {e}") from None


# --- the trainer config of each run ----------------------------------------------------------------


def merge(base: dict, update: dict) -> dict:
    """`update` merged into `base`, mappings key by key."""
    merged = dict(base)
    for key, value in update.items():
        merged[key] = (
            merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def reject_workflow_keys(keys, where: str) -> None:
    for key in keys:
        owner = WORKFLOW_KEYS.get(key)
        if owner:
            raise PodsBenchError(f"config key {where}{key} is set by the workflow: use {owner} instead")


def warm_start_dir(config: dict) -> str:
    return layout.warm_start_dir(config["warm_start"]["name"])


def runs_dir(config: dict) -> str:
    return ExperimentLayout(config["experiment"]).runs


def _train_base(config: dict, root: Path) -> dict:
    if not config["train_base"]:
        return {}
    try:
        base = yaml.safe_load((root / config["train_base"]).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise PodsBenchError(
            f"config key train_base: cannot read {config['train_base']} ({str(e).splitlines()[0]})"
        ) from None
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
    return ExperimentLayout(config["experiment"]).run(arm, seed)


def run_overrides(config: dict, arm: str, seed) -> list[str]:
    return arm_overrides(config, arm) + [f"seed={seed}", f"output_dir={run_dir(config, arm, seed)}"]


def resolve_runs(config: dict, hardware: dict, root: Path = ROOT) -> tuple[dict, dict]:
    """(the shared trainer settings, arm -> the trainer config of its first seed, defaults filled in),
    each checked by the trainer's own config loader, so that a trainer-level mistake stops the
    workflow before any job starts."""
    settings = shared_train_settings(config, hardware, root)
    try:
        config_from_dict(settings)
    except PodsBenchError as e:
        raise PodsBenchError(f"train: {e}") from None
    resolved = {}
    for arm in config["arms"]:
        overrides = run_overrides(config, arm, config["seeds"][0])  # its own line names arms.<arm>.set.<key>
        try:
            resolved[arm] = config_from_dict(settings, overrides)
        except PodsBenchError as e:
            raise PodsBenchError(f"arms.{arm}: {e}") from None
    return settings, resolved


# --- reading an experiment config without Snakemake -----------------------------------------------------------------------------


def with_schema_defaults(config: dict, schema: str | Path = SCHEMA) -> dict:
    """`config` with the JSON schema's `default`s filled in where a key is missing, at every level
    (arms' `set` included), as Snakemake's `validate` fills them: jsonschema's documented way of
    extending a validator, so that reading an experiment needs no Snakemake. The config must follow
    the schema (`schema_error`)."""
    import jsonschema

    schema = read_schema(schema)
    base = jsonschema.validators.validator_for(schema)
    check_properties = base.VALIDATORS["properties"]

    def fill_defaults(validator, properties, instance, subschema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub:
                    instance.setdefault(key, json.loads(json.dumps(sub["default"])))  # a copy
        yield from check_properties(validator, properties, instance, subschema)

    filled = json.loads(json.dumps(config))
    jsonschema.validators.extend(base, {"properties": fill_defaults})(schema).validate(filled)
    return filled


def load_experiment(path: str | Path) -> tuple[dict, dict]:
    """(experiment config with the schema's defaults filled in, its hardware setup), outside
    Snakemake; a config against the schema is a one-line error naming the key."""
    config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    mistake = schema_error(config)
    if mistake:
        raise PodsBenchError(f"{path}: {mistake}")
    config = with_schema_defaults(config)
    return config, hardware_setup(config["hardware"])


def resolve_arms(path: str | Path) -> dict:
    """Arm -> the trainer config of its first seed, as the workflow's training job gets it."""
    config, hardware = load_experiment(path)
    return resolve_runs(config, hardware)[1]
