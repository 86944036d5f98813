"""The workflow's adapter: what each Snakemake job of an experiment asks the scheduler for and runs
(resources, the launch line, `--set` flags, the analysis options), the markers that say a run is
finished, and the order of seeds (`pair_seeds`). Only workflows/rules/*.smk import it; the
experiment itself (its config, the trainer config of each run) is pods_bench/experiment.py.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from pods_bench.experiment import ROOT, job_resources  # noqa: F401  (the rules' jobs.job_resources)

if TYPE_CHECKING:
    from pods_bench.experiment import AnalysisChoices, Experiment

# How every job runs the package (the workflow puts its own Python first on the jobs' PATH).
PODS_BENCH = "python -m pods_bench"


def previous_seed_runs(experiment: Experiment, seed) -> list[tuple[str, int]]:
    """(arm, seed) of every run a training job of `seed` waits for under `pair_seeds`: all arms of the
    seed before it in `seeds`. Seed by seed, the arms of one seed are then the only training jobs
    that run together (the train rule's priority keeps evaluations out while one is ready), so
    clock comparisons see every arm of a seed under the same machine conditions."""
    seeds = experiment.seeds
    at = seeds.index(int(seed))
    if not experiment.pair_seeds or at == 0:
        return []
    return [(arm, seeds[at - 1]) for arm in experiment.arms]


def finished_run(experiment: Experiment, arm: str, seed, arm_config) -> str:
    """The marker of run (arm, seed) once its evaluations are complete: the training job's where the
    trainer evaluates inline (`eval.inline`), else the evaluation job's."""
    where = experiment.layout
    return where.train_done(arm, seed) if arm_config.eval.inline else where.eval_done(arm, seed)


def train_launcher(hardware: dict, arm_config, root: Path = ROOT) -> str:
    """One process, or the distributed engine (`accelerate launch`) with the setup's process count."""
    if hardware["processes"] <= 1:
        return PODS_BENCH
    flags = [
        f"--num_processes {hardware['processes']}",
        "--num_machines 1",
        f"--mixed_precision {arm_config.model.mixed_precision}",
        "--dynamo_backend no",
    ]
    if hardware.get("accelerate_config"):
        flags.insert(0, f"--config_file {Path(root) / hardware['accelerate_config']}")
    else:  # torchrun's launcher; with device cpu the processes join a gloo group
        flags.append("--multi_gpu")
    return f"accelerate launch {' '.join(flags)} -m pods_bench"


def set_flags(items) -> str:
    """`--set` items as options of `pods-bench train`, quoted for the shell."""
    return " ".join(f"--set {shlex.quote(item)}" for item in items)


def analysis_options(analysis: AnalysisChoices, command: str) -> str:
    """The `analysis` settings the config gives, as options of `pods-bench aggregate` or `plot`
    (the analysis chooses the others)."""
    keys = ["baseline", "benchmark", "metric", "q"] + (["bootstrap", "target"] if command == "aggregate" else [])
    given = {key: getattr(analysis, key) for key in keys if getattr(analysis, key) is not None}
    return " ".join(f"--{key} {shlex.quote(str(value))}" for key, value in given.items())


def paper_logs_dir(experiment: Experiment, root: Path = ROOT) -> str:
    """The published-logs folder: $PODS_BENCH_PAPER_LOGS, else `paper_logs` relative to the project root."""
    path = os.environ.get("PODS_BENCH_PAPER_LOGS") or experiment.paper_logs
    return str((Path(root) / path).resolve())
