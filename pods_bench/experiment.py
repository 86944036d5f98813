"""An experiment config (config/<experiment>.yaml), read and checked: the typed `Experiment` (its
defaults in code), the schema's one-line messages, the hardware setup, and the trainer config of
each run. What each job asks the scheduler for and runs is the workflow's adapter,
pods_bench/workflow_jobs.py.

Each key is declared once, in the classes below (type, default, limits, description); the JSON
schema Snakemake checks a config against (workflows/schemas/config.schema.yaml) is written from them
(`python -m pods_bench.experiment --write-schema`, checked by tests/test_experiment.py).

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
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from pods_bench import layout
from pods_bench.config import config_from_dict, flatten
from pods_bench.errors import PodsBenchError, require
from pods_bench.io import atomic_write_text
from pods_bench.layout import ExperimentLayout
from pods_bench.tasks import get_task
from pods_bench.typed_config import config_key, json_schema, section_from_dict

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


# --- the experiment: what config/<experiment>.yaml holds --------------------------------------------
# Each key is declared once, here: its type, default, limits and description. The JSON schema that
# Snakemake checks a config against (workflows/schemas/config.schema.yaml) is written from these
# classes (`python -m pods_bench.experiment --write-schema`; tests/test_experiment.py checks it is
# up to date).

NAME = "^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # names that become folder names


@dataclass
class Arm:
    """One compared training variant (an arm name becomes a folder name)."""

    rule: str = config_key(
        description='selection rule (trainer key selection.rule); "all" with n == m is vanilla GRPO'
    )
    n: int = config_key(description="rollouts generated per prompt", minimum=2)
    m: int = config_key(description="rollouts trained on per prompt", minimum=2)
    set: dict[str, Any] = config_key(
        default_factory=dict,
        description="other trainer settings of this arm, as dotted keys (passed as --set key=value)",
        propertyNames={"pattern": "^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*$"},
    )


@dataclass
class WarmStart:
    """Build the starting model with `pods-bench pretrain` (the smoke model) instead of loading one."""

    enabled: bool = False
    name: str = config_key(
        "arith-tiny",
        description="folder under results/warm_start/ (shared by experiments with the same settings)",
        pattern=NAME,
    )
    steps: int | None = config_key(None, minimum=1)
    seconds: float | None = config_key(None, exclusiveMinimum=0)
    seed: int = config_key(0, minimum=0)
    seeds: list[int] | None = config_key(
        None,
        description="several warm starts, one per pretraining seed (replacing seed): run seed k starts from the "
        "warm start of seeds[k % len(seeds)] (summary/robustness.md compares the arms on each); null: one",
        items={"minimum": 0},
        minItems=1,
        uniqueItems=True,
    )

    @property
    def pretraining_seeds(self) -> list[int]:
        return list(self.seeds) if self.seeds else [self.seed]

    def pretraining_seed_of_run(self, run_seed: int) -> int:
        seeds = self.pretraining_seeds
        return seeds[int(run_seed) % len(seeds)]

    def folder_name(self, pretraining_seed: int) -> str:
        """Its folder under results/warm_start/: `name` for seed 0 (shared with the experiments that
        use the one default warm start), `name-seed<k>` for the others."""
        return self.name if pretraining_seed == 0 else f"{self.name}-seed{pretraining_seed}"


@dataclass
class AnalysisChoices:
    """What the speed-up table compares; None: the analysis chooses."""

    baseline: str | None = config_key(None, description="the arm the others are compared with")
    benchmark: str | None = None
    metric: Literal["answer_acc", "format_acc", "both_acc"] | None = None
    q: float | None = config_key(
        None, description="the threshold is q x the baseline's peak accuracy", exclusiveMinimum=0, maximum=1
    )
    bootstrap: int | None = config_key(
        None, description="bootstrap resamples of the confidence intervals (aggregate only)", minimum=0
    )
    target: float | None = config_key(
        None,
        description="the fixed target accuracy of the MLPerf-style time-to-target table (summary/mlperf.md), "
        "derived before the runs from separate baseline seeds with `pods-bench target` "
        "(pods_bench/analysis/time_to_target.py); null: none",
        exclusiveMinimum=0,
        maximum=1,
    )


@dataclass
class BaselineStepsBudget:
    """The budget as `steps` of the baseline arm, timed on this machine (pods_bench/calibration.py)."""

    steps: int = config_key(minimum=1)
    checkpoints: int = config_key(12, description="a checkpoint every budget / checkpoints seconds", minimum=1)
    timed_steps: int = config_key(
        3, description="steps timed after two untimed ones (the budget uses their median)", minimum=1
    )
    side_by_side: int | None = config_key(
        None,
        description="copies of the timed run trained at once, since a step beside another job is slower than "
        "alone; null: as many as the workflow trains at once here (the cores over a training job's threads, "
        "at most the number of runs; 1 under a cluster executor)",
        minimum=1,
    )


_RESOURCE = {"gpu": {"type": "integer", "minimum": 0}, "cpus": {"type": "integer", "minimum": 1}}
_RESOURCE["mem_mb"] = {"type": "integer", "minimum": 1}
_TRAIN_RESOURCES = {
    **_RESOURCE,
    "runtime_factor": {"type": "number", "exclusiveMinimum": 0},
    "runtime_overhead_min": {"type": "number", "minimum": 0},
    "runtime_min": {"type": "integer", "minimum": 1},
}
_EVALUATE_RESOURCES = {**_RESOURCE, "runtime_min": {"type": "integer", "minimum": 1}}


def _closed(properties: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "properties": properties}


@dataclass(kw_only=True)
class Experiment:
    """One experiment of the replication workflow: arms (selection rule, n, m, other trainer settings)
    x seeds x training benchmark x evaluation benchmarks x hardware setup. The workflow checks its
    schema (filling in the defaults) before any job starts; the trainer settings under `train` and
    `arms.<arm>.set` are then checked by the trainer's own config loader (pods_bench/config.py)."""

    experiment: str = config_key(
        description="results go to results/<experiment>/, figures to figures/<experiment>/", pattern=NAME
    )
    description: str = ""
    source: str = config_key(
        "", description="where the settings come from (paper section, file and line of the official code)"
    )
    hardware: str = config_key(
        description="a setup of config/hardware.yaml (cpu, cpu_ddp, l40s, h200, h100x8, a100x8)"
    )
    seeds: list[int] = config_key(
        description="one training run per (arm, seed); integers, given in a config file",
        minItems=1,
        uniqueItems=True,
        items={"minimum": 0},
    )
    benchmark: str = config_key(description="the training task (trainer key task.name)")
    eval_benchmarks: list[str] = config_key(
        description="benchmarks every checkpoint is evaluated on (trainer key eval.benchmarks)",
        minItems=1,
        uniqueItems=True,
    )
    arms: dict[str, Arm] = config_key(
        description="the compared training variants; arm names become folder names",
        minProperties=1,
        propertyNames={"pattern": NAME},
    )
    train_base: str | None = config_key(
        None,
        description="a trainer config file (relative to the project root, e.g. config/train/qwen2.5-3b-lora.yaml) "
        "holding the settings shared by every arm; `train` is merged over it",
    )
    train: dict[str, Any] = config_key(
        default_factory=dict,
        description="trainer settings shared by every arm, nested as in the trainer's YAML config",
    )
    warm_start: WarmStart = config_key(
        default_factory=WarmStart,
        description="build the starting model with `pods-bench pretrain` (the smoke model) instead of loading one",
    )
    analysis: AnalysisChoices = config_key(
        default_factory=AnalysisChoices, description="what the speed-up table compares (null -- the analysis chooses)"
    )
    budget_in_baseline_steps: BaselineStepsBudget | None = config_key(
        None,
        description="the training budget as a number of the baseline arm's (analysis.baseline) steps, timed on this "
        "machine before the runs by the `calibrate` job (pods_bench/calibration.py): every arm gets the same "
        "seconds of training clock, steps x the baseline's measured seconds per step, with a checkpoint every "
        "budget / checkpoints seconds; train.budget.max_train_time_s, if set, caps it. null: the budget is "
        "train.budget's, in seconds",
    )
    pair_seeds: bool = config_key(
        True,
        description="the arms of one seed train side by side: a seed's training jobs wait until every run of the "
        "seed before it (in `seeds`) is finished, evaluation included, so every arm of a seed trains under the "
        "same machine conditions and the analysis pairs arms by seed (docs/workflow.md); false lets the seeds "
        "run at once (a cluster where every job has a node of its own)",
    )
    resources: dict[str, Any] = config_key(
        default_factory=dict,
        description="per-job resources that replace the hardware setup's (same keys as config/hardware.yaml)",
        schema=_closed({"train": _closed(_TRAIN_RESOURCES), "evaluate": _closed(_EVALUATE_RESOURCES)}),
    )
    paper_logs: str = config_key(
        "../shared/data/pods-paper-logs",
        description="published-logs folder for the `paper_figures` target, relative to the project root "
        "(the environment variable PODS_BENCH_PAPER_LOGS wins)",
    )

    def __post_init__(self):
        if self.budget_in_baseline_steps is not None:
            baseline = self.analysis.baseline
            require(
                baseline in self.arms,
                f"config key budget_in_baseline_steps counts the steps of analysis.baseline: set it to one of the arms "
                f"({', '.join(self.arms)}), got {baseline!r}",
            )
        starts = self.warm_start.pretraining_seeds
        require(
            len(starts) <= len(self.seeds),
            f"config key warm_start.seeds: {len(starts)} warm starts need at least as many run seeds, got {len(self.seeds)}",
        )

    @classmethod
    def from_config(cls, config: dict) -> Experiment:
        """The typed experiment of plain `config` (a YAML file's content, or Snakemake's `config`,
        which has passed the schema: schema_error gives the messages for a config that has not)."""
        return section_from_dict(cls, config)

    def to_dict(self) -> dict:
        """Plain data with every default filled in, as Snakemake's `validate` fills them."""
        return asdict(self)

    @property
    def layout(self) -> ExperimentLayout:
        return ExperimentLayout(self.experiment)


# --- the schema file, written from the classes above -----------------------------------------------


def schema_text() -> str:
    """workflows/schemas/config.schema.yaml as `Experiment` declares it."""
    doc = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pods-bench experiment",
        "description": " ".join(Experiment.__doc__.split()),
        **json_schema(Experiment),
    }
    header = "# Written from pods_bench/experiment.py by `python -m pods_bench.experiment --write-schema`: edit the\n"
    header += "# classes there, not this file (tests/test_experiment.py checks that the two agree).\n"
    return header + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


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
    if error.validator == "anyOf" and error.context:  # a section that may also be null
        inner = [e for e in error.context if e.validator != "type"]
        if isinstance(error.instance, dict) and inner:  # the mistake inside the mapping
            import jsonschema

            return schema_error_line(jsonschema.exceptions.best_match(inner), command_line_keys)
        kinds = {"null": "null", "object": "a mapping"}
        allowed = " or ".join(
            kinds.get(branch.get("type"), str(branch.get("type"))) for branch in error.validator_value
        )
        return f"config key {key} must be {allowed}, got {error.instance!r}"
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
    same = same or [best]  # best_match chose an error inside an anyOf branch
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


def job_resources(rule: str, hardware: dict, resources: dict, arm_config=None) -> dict:
    """Snakemake resources of one `rule` job ("train" or "evaluate") on `hardware` (a setup of
    config/hardware.yaml), with the experiment config's `resources` replacing the setup's; a
    training job's runtime follows its arm's budget (`arm_config`, the arm's trainer config)."""
    spec = {**hardware[rule], **resources.get(rule, {})}
    if "runtime_min" in spec:
        runtime = spec["runtime_min"]
    else:  # training: the time budget, slowed down by the hardware's factor, plus start-up
        budget_s = arm_config.budget.max_train_time_s
        if budget_s is None:
            raise PodsBenchError(
                f"config key resources.{rule}.runtime_min is needed: the budget has no max_train_time_s"
            )
        runtime = math.ceil(budget_s / 60 * spec["runtime_factor"] + spec["runtime_overhead_min"])
    job = {"mem_mb": spec["mem_mb"], "runtime": runtime, "cpus_per_task": spec["cpus"], "gpu": spec["gpu"]}
    if spec["gpu"] and hardware.get("gpu_model"):
        job["gpu_model"] = hardware["gpu_model"]
    return job


def check_benchmarks(experiment: Experiment) -> None:
    """The training and evaluation benchmarks are tasks pods-bench knows."""
    for key, name in [("benchmark", experiment.benchmark)] + [
        (f"eval_benchmarks[{i}]", b) for i, b in enumerate(experiment.eval_benchmarks)
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


def warm_start_dir(experiment: Experiment, run_seed: int | None = None) -> str:
    """The folder of the warm start that run seed `run_seed` starts from (None: the first run seed's)."""
    warm = experiment.warm_start
    seed = warm.pretraining_seed_of_run(experiment.seeds[0] if run_seed is None else run_seed)
    return layout.warm_start_dir(warm.folder_name(seed))


def warm_start_folders(experiment: Experiment) -> dict[str, int]:
    """Folder name under results/warm_start/ -> its pretraining seed, for every warm start the runs use."""
    warm = experiment.warm_start
    return {warm.folder_name(seed): seed for seed in warm.pretraining_seeds}


def _train_base(experiment: Experiment, root: Path) -> dict:
    path = experiment.train_base
    if not path:
        return {}
    try:
        base = yaml.safe_load((root / path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise PodsBenchError(f"config key train_base: cannot read {path} ({str(e).splitlines()[0]})") from None
    if not isinstance(base, dict):
        raise PodsBenchError(f"config key train_base: {path} must hold a mapping of trainer settings")
    reject_workflow_keys(flatten(base), f"{path}: ")
    return base


def shared_train_settings(experiment: Experiment, hardware: dict, root: Path = ROOT) -> dict:
    """The trainer config every arm starts from (results/<experiment>/configs/train.yaml)."""
    reject_workflow_keys(flatten(experiment.train), "train.")
    settings = json.loads(json.dumps(merge(_train_base(experiment, root), experiment.train)))  # plain data, a copy
    settings["experiment"] = experiment.experiment
    settings["device"] = hardware["device"]
    settings.setdefault("task", {})["name"] = experiment.benchmark
    settings.setdefault("eval", {})["benchmarks"] = list(experiment.eval_benchmarks)
    if experiment.warm_start.enabled:
        settings.setdefault("model", {})["name"] = warm_start_dir(experiment)
    return settings


def _set_value(value) -> str:
    """A value as the trainer's `--set key=value` reads it (strings raw, everything else YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def arm_overrides(experiment: Experiment, arm: str) -> list[str]:
    """The `--set` items that make the shared settings into arm `arm`."""
    spec = experiment.arms[arm]
    reject_workflow_keys(spec.set, f"arms.{arm}.set.")
    items = [f"arm={arm}", f"selection.rule={spec.rule}", f"selection.n={spec.n}", f"selection.m={spec.m}"]
    return items + [f"{key}={_set_value(value)}" for key, value in spec.set.items()]


def run_overrides(experiment: Experiment, arm: str, seed) -> list[str]:
    items = arm_overrides(experiment, arm) + [f"seed={seed}", f"output_dir={experiment.layout.run(arm, seed)}"]
    if experiment.warm_start.enabled and len(experiment.warm_start.pretraining_seeds) > 1:
        items.append(f"model.name={warm_start_dir(experiment, int(seed))}")  # this seed's warm start
    return items


def resolve_runs(experiment: Experiment, hardware: dict, root: Path = ROOT) -> tuple[dict, dict]:
    """(the shared trainer settings, arm -> the trainer config of its first seed, defaults filled in),
    each checked by the trainer's own config loader, so that a trainer-level mistake stops the
    workflow before any job starts."""
    settings = shared_train_settings(experiment, hardware, root)
    try:
        config_from_dict(settings)
    except PodsBenchError as e:
        raise PodsBenchError(f"train: {e}") from None
    resolved = {}
    for arm in experiment.arms:
        overrides = run_overrides(experiment, arm, experiment.seeds[0])  # its own line names arms.<arm>.set.<key>
        try:
            resolved[arm] = config_from_dict(settings, overrides)
        except PodsBenchError as e:
            raise PodsBenchError(f"arms.{arm}: {e}") from None
    return settings, resolved


# --- reading an experiment config without Snakemake ---------------------------------------------------


def load_experiment(path: str | Path) -> tuple[Experiment, dict]:
    """(the experiment, its hardware setup), outside Snakemake; a config against the schema is a
    one-line error naming the key."""
    config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    mistake = schema_error(config)
    if mistake:
        raise PodsBenchError(f"{path}: {mistake}")
    experiment = Experiment.from_config(config)
    return experiment, hardware_setup(experiment.hardware)


def resolve_arms(path: str | Path) -> dict:
    """Arm -> the trainer config of its first seed, as the workflow's training job gets it."""
    config, hardware = load_experiment(path)
    return resolve_runs(config, hardware)[1]


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write-schema"]:
        sys.exit("usage: python -m pods_bench.experiment --write-schema")
    atomic_write_text(SCHEMA, schema_text())
    print(f"wrote {SCHEMA.relative_to(ROOT)}")
