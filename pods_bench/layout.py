"""Where an experiment's files live: the one address book of `results/` and `figures/`, used by the
config's default run folder, pods_bench/experiment.py, the workflow's rules and the analysis.

    results/<experiment>/
        configs/train.yaml               the trainer settings every arm starts from
        prepare.done                     the datasets and model fetched (no warm start)
        runs/<arm>/seed<k>/              one run folder (its files: pods_bench/run_dir.py)
            train.done, eval.done        the workflow's markers of a finished job
        logs/<rule>/<arm>/seed<k>.log    each job's console
        benchmarks/<rule>/<arm>/seed<k>.tsv   Snakemake's per-job timing
        summary/                         tables, manifest.yaml (pods-bench aggregate)
    results/warm_start/<name>/           the smoke model built by `pods-bench pretrain`
    figures/<experiment>/                figures

Paths are strings relative to the project root, as Snakemake patterns want them; an arm or seed of
"{arm}" / "{seed}" gives the pattern with that wildcard.
"""

from __future__ import annotations

from dataclasses import dataclass

RESULTS = "results"
FIGURES = "figures"
RUNS = "runs"  # the folder of an experiment that holds its runs (the analysis looks for it)
SEED_PREFIX = "seed"  # runs/<arm>/seed<k>
TRAIN_DONE, EVAL_DONE, PREPARE_DONE = "train.done", "eval.done", "prepare.done"
CALIBRATION = "calibration"  # <experiment>/calibration/: pods-bench calibrate's folder
CALIBRATION_JSON, CALIBRATED_CONFIG = "calibration.json", "train.yaml"  # in it


def warm_start_dir(name: str) -> str:
    return f"{RESULTS}/warm_start/{name}"


@dataclass(frozen=True)
class ExperimentLayout:
    """The paths of experiment `name`."""

    name: str

    @property
    def root(self) -> str:
        return f"{RESULTS}/{self.name}"

    @property
    def runs(self) -> str:
        return f"{self.root}/{RUNS}"

    def run(self, arm, seed) -> str:
        return f"{self.runs}/{arm}/{SEED_PREFIX}{seed}"

    def train_done(self, arm, seed) -> str:
        return f"{self.run(arm, seed)}/{TRAIN_DONE}"

    def eval_done(self, arm, seed) -> str:
        return f"{self.run(arm, seed)}/{EVAL_DONE}"

    @property
    def prepare_done(self) -> str:
        return f"{self.root}/{PREPARE_DONE}"

    @property
    def train_config(self) -> str:
        return f"{self.root}/configs/train.yaml"

    @property
    def calibration(self) -> str:
        """`pods-bench calibrate`'s folder: calibration.json, the calibrated train.yaml, the timed run."""
        return f"{self.root}/{CALIBRATION}"

    @property
    def calibration_json(self) -> str:
        return f"{self.calibration}/{CALIBRATION_JSON}"

    @property
    def calibrated_train_config(self) -> str:
        return f"{self.calibration}/{CALIBRATED_CONFIG}"

    @property
    def summary(self) -> str:
        return f"{self.root}/summary"

    @property
    def logs(self) -> str:
        return f"{self.root}/logs"

    def log(self, rule: str, arm, seed) -> str:
        return f"{self.logs}/{rule}/{arm}/{SEED_PREFIX}{seed}.log"

    @property
    def benchmarks(self) -> str:
        return f"{self.root}/benchmarks"

    def benchmark(self, rule: str, arm, seed) -> str:
        return f"{self.benchmarks}/{rule}/{arm}/{SEED_PREFIX}{seed}.tsv"

    @property
    def figures(self) -> str:
        return f"{FIGURES}/{self.name}"
