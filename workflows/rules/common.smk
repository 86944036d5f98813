# The experiment config, checked before any job starts, and what the rules need from it. How the
# config becomes runs is pods_bench/experiment.py, and runs become jobs pods_bench/workflow_jobs.py
# (both unit-tested in tests/test_experiment.py); this file only reads `config` into the typed
# `EXPERIMENT`, calls them, and turns their one-line errors into the workflow's.
#
# Order of the checks, each failing with one line that names the key:
#   1. the JSON schema (workflows/schemas/config.schema.yaml): types, unknown keys, seeds as integers;
#   2. the hardware setup exists (config/hardware.yaml) and the benchmarks are known tasks;
#   3. the trainer's own config loader accepts the shared `train` settings and every arm;
#   4. every arm fits the setup's devices (pods_bench/planning/): one that cannot fit at all stops
#      here; one whose longest batches may not fit gets a one-line warning (`pods-bench plan` tells more).
# Snakemake's `validate` then fills in the schema's defaults.

import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.utils import validate

from pods_bench import experiment as experiment_settings
from pods_bench import workflow_jobs as jobs
from pods_bench import slurm
from pods_bench.errors import PodsBenchError
from pods_bench.model_sources import is_gguf
from pods_bench.pretrain import PretrainConfig

ROOT = Path(workflow.basedir)
SCHEMA = ROOT / "workflows" / "schemas" / "config.schema.yaml"
HARDWARE_FILE = ROOT / "config" / "hardware.yaml"
# workflows/envs/ as in Snakemake's workflow template; the file is a link to environment.yml at the
# root, which the README and tests/test_packaging.py name, so the dependencies are listed once.
ENVIRONMENT = str(ROOT / "workflows" / "envs" / "pods-bench.yaml")
CONFIG_FILES = [str(p) for p in workflow.overwrite_configfiles] or [str(ROOT / "config" / "smoke.yaml")]

# Jobs run `python -m pods_bench` and `accelerate` from the environment snakemake itself runs in (a
# venv need not be activated), and import pods_bench from this source tree (so `--sdm conda` works
# with environment.yml alone).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
PODS_BENCH = jobs.PODS_BENCH
PRETRAIN_THREADS = PretrainConfig().threads


def torch_threads(threads: int, processes: int = 1) -> str:
    """The shell prefix that shares a job's `threads` among its `processes` as torch threads (at
    least one each). Snakemake exports the job's whole `threads` as MKL_NUM_THREADS (and
    OMP_NUM_THREADS), and torch takes MKL_NUM_THREADS before OMP_NUM_THREADS, so both are set: a
    calibration that times two runs in one job, or a job of several processes, would otherwise
    oversubscribe the cores."""
    each = max(1, threads // processes)
    return f"export OMP_NUM_THREADS={each} MKL_NUM_THREADS={each}; "


def config_error(message: str):
    """Bad input: one line naming the key, then exit before any job starts."""
    print(f"pods-bench workflow: {', '.join(CONFIG_FILES)}: {message}", file=sys.stderr)
    sys.exit(2)


def checked(function, *args):
    """function(*args), or the workflow's one-line error for its PodsBenchError."""
    try:
        return function(*args)
    except PodsBenchError as e:
        config_error(str(e))


_schema_error = experiment_settings.schema_error(config, workflow.config_settings.config, SCHEMA)
if _schema_error:
    config_error(_schema_error)
validate(config, str(SCHEMA))  # fills in the defaults (Experiment's own, tests/test_experiment.py)

EXPERIMENT = checked(experiment_settings.Experiment.from_config, config)  # the typed experiment
LAYOUT = EXPERIMENT.layout  # every path of the experiment (pods_bench/layout.py)
EXP_DIR, RUNS_DIR, SUMMARY_DIR = LAYOUT.root, LAYOUT.runs, LAYOUT.summary
FIGURES_DIR, LOG_DIR = LAYOUT.figures, LAYOUT.logs
# the HTML report's front page: the verdict (summary/verdict.md) over workflows/report/workflow.rst
FRONT_PAGE = f"{SUMMARY_DIR}/report_front.rst"

HARDWARE = checked(experiment_settings.hardware_setup, EXPERIMENT.hardware, HARDWARE_FILE)
checked(experiment_settings.check_benchmarks, EXPERIMENT)
# the settings shared by every arm, and arm -> the trainer config of its first seed with defaults
# filled in (for resources and the manifest)
TRAIN_SETTINGS, RESOLVED = checked(experiment_settings.resolve_runs, EXPERIMENT, HARDWARE, ROOT)
# imported where it is first used: the plan imports torch (~2.5 s), so a config the schema, experiment,
# hardware or benchmark checks above reject stops without it
from pods_bench.planning.plan import check_fits

for _warning in checked(check_fits, RESOLVED, HARDWARE, EXPERIMENT.hardware):
    print(f"pods-bench workflow: warning: {_warning}", file=sys.stderr)
WARM_START = EXPERIMENT.warm_start
# folder name under results/warm_start/ -> pretraining seed: one, or one per warm_start.seeds
WARM_START_FOLDERS = experiment_settings.warm_start_folders(EXPERIMENT)
# a budget in baseline steps: the `calibrate` job times the baseline here and writes the shared
# settings with that budget, which every training job then reads (pods_bench/calibration.py)
CALIBRATED = EXPERIMENT.budget_in_baseline_steps
if CALIBRATED and HARDWARE["processes"] > 1:
    config_error("config key budget_in_baseline_steps: the calibration times one process; this setup trains with "
                 f"{HARDWARE['processes']} (give train.budget.max_train_time_s instead)")
RUN_CONFIG = LAYOUT.calibrated_train_config if CALIBRATED else LAYOUT.train_config


def calibration_side_by_side() -> int:
    """How many timed runs the calibration trains at once: as many training jobs as run at once
    here, since a step beside another job is slower than alone (pods_bench/calibration.py). Under
    a cluster executor every job has its own allocation: 1."""
    if CALIBRATED.side_by_side is not None:
        return CALIBRATED.side_by_side
    if not workflow.local_exec:
        return 1
    cores = getattr(workflow.global_resources.get("_cores"), "value", None) or 1  # None: a dry run without --cores
    at_once = len(EXPERIMENT.arms) if EXPERIMENT.pair_seeds else len(EXPERIMENT.arms) * len(EXPERIMENT.seeds)
    train_threads = job_resources("train", next(iter(EXPERIMENT.arms)))["cpus_per_task"]
    return max(1, min(at_once, cores // train_threads))


def check_cluster_submission() -> None:
    """With the SLURM executor (profiles/slurm), before the first submission: the account and
    partition of every job to submit exist on the cluster, else one line and exit status 2
    (the plugin would fail each job with sbatch's message, a wrong account with a traceback)."""
    plugin = workflow.executor_plugin
    if plugin is None or plugin.name != "slurm":
        return
    value = lambda job, key: str(job.resources[key]) if job.resources.get(key) not in (None, "") else None
    jobs = [job for job in workflow.dag.needrun_jobs() if not job.is_local]
    try:
        slurm.check_submission((value(job, "slurm_account"), value(job, "slurm_partition")) for job in jobs)
    except PodsBenchError as e:
        print(f"pods-bench workflow: {e}", file=sys.stderr)
        sys.exit(2)


def run_dir(arm, seed) -> str:
    return LAYOUT.run(arm, seed)


def run_overrides(arm, seed) -> list[str]:
    return checked(experiment_settings.run_overrides, EXPERIMENT, arm, seed)


def finished_run(arm, seed) -> str:
    return jobs.finished_run(EXPERIMENT, arm, seed, RESOLVED[arm])


def job_resources(rule: str, arm: str | None = None) -> dict:
    return checked(jobs.job_resources, rule, HARDWARE, EXPERIMENT.resources, RESOLVED.get(arm))


def train_launcher(arm: str) -> str:
    return jobs.train_launcher(HARDWARE, RESOLVED[arm], ROOT)


wildcard_constraints:
    arm="|".join(re.escape(arm) for arm in EXPERIMENT.arms),
    seed=r"\d+",
