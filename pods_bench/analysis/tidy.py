"""The one table every analysis reads: own runs and the paper's published logs both load into it.

A `Results` is what an experiment produced: a set of arms (GRPO, PODS with some n, m and rule, ...)
trained for the same task on the same hardware, each with one or more seeds (the experiment's
settings are pods_bench/experiment.py's `Experiment`). Its evaluations form a tidy table, one row per
(arm, seed, checkpoint, benchmark, metric):

    experiment, arm, seed, time_s, raw_time_s, step, benchmark, metric, value, n_repeats, n_problems,
    rollouts, tokens, flops, eval_time_s

- `value` is the mean over the evaluation repeats of that checkpoint (`n_repeats` of them, each on
  `n_problems` problems), so accuracies are fractions in [0, 1] and `mean_length` is in tokens.
- `time_s` is training time in seconds on the experiment's common checkpoint grid: the time at
  which the curves of all seeds of an arm are compared (see the loaders for how each source gets
  there); `raw_time_s` is the time the checkpoint was actually taken.
- metrics: `answer_acc` (answer correct), `format_acc` (format correct), `both_acc`, `mean_length`.
- `rollouts`, `tokens`: completions and completion tokens generated up to the checkpoint (pilots,
  refill rounds and dropped groups included), on the arm's common grid like `time_s`: the cost axes
  on which allocation strategies are compared (NaN for the published logs).
- `eval_time_s`: seconds the checkpoint's evaluation on that benchmark took (the training clock is
  paused meanwhile; time_to_target.py puts it back on the clock; NaN for the published logs).

Seconds per training step are a second table, one row per (arm, seed, phase); phase `total` is
always present, own runs add generation / rewards / selection / update / sync / other. Own runs
have a third, the wasted work per step (WASTE_COLUMNS), and a fourth, the model each run started
from (START_COLUMNS), each one row per (arm, seed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from pods_bench.errors import PodsBenchError
from pods_bench.run_dir import PHASE_LABELS
from pods_bench.run_dir import PHASES as TRAINER_PHASES

EVAL_COLUMNS = [
    "experiment",
    "arm",
    "seed",
    "time_s",
    "raw_time_s",
    "step",
    "benchmark",
    "metric",
    "value",
    "n_repeats",
    "n_problems",
    "rollouts",
    "tokens",
    "flops",
    "eval_time_s",
]
# x-axes an arm's curve can be read on: the training clock, and what the run spent up to the
# checkpoint (cumulative rollouts, completion tokens and FLOPs of every phase, pods_bench/flops.py;
# own runs only, NaN for the published logs and for FLOPs in logs written before they were counted)
COST_AXES = ("rollouts", "tokens", "flops")
AXES = {"time": "time_s", **{axis: axis for axis in COST_AXES}}
STEP_TIME_COLUMNS = ["experiment", "arm", "seed", "phase", "seconds_per_step"]
# the wasted work per step, named as TRL and verl name it (docs/results-format.md): one row per run,
# each a mean over its steps; NaN where a log predates the field (and for the published logs)
WASTE_FIELDS = (
    "num_gen_batches",
    "rollouts_generated",
    "rollouts_not_trained",
    "frac_reward_zero_std",
    "groups_discarded_zero_std",
    "groups_discarded_surplus",
    "groups_discarded_low_std",
)
WASTE_COLUMNS = ["experiment", "arm", "seed", *WASTE_FIELDS]
# the model each run started from (run.json's model.name; own runs only): one row per (arm, seed)
START_COLUMNS = ["arm", "seed", "start"]
ARM_COLUMNS = ["arm", "n", "m", "rule"]
ACCURACY_METRICS = ("answer_acc", "format_acc", "both_acc")
LENGTH_METRIC = "mean_length"
# stacking order of the per-phase bars (the trainer's phases, pods_bench/run_dir.py); `other` is
# whatever the phases do not account for
PHASES = (*(PHASE_LABELS[p] for p in TRAINER_PHASES), "other")


@dataclass
class Results:
    name: str
    evals: pd.DataFrame  # EVAL_COLUMNS
    step_times: pd.DataFrame  # STEP_TIME_COLUMNS
    arms: pd.DataFrame  # ARM_COLUMNS, in display order
    hardware: str  # for axis labels, e.g. "one L40S", "8×H100"
    source: str  # "runs" (own results) or "paper" (the published logs)
    default_benchmark: str
    default_metric: str = "answer_acc"
    default_baseline: str | None = None
    time_unit: str | None = None  # "s", "min" or "h" for display; None: chosen from the budget
    calibration: dict | None = None  # calibration.json of a budget in baseline steps (pods_bench/calibration.py)
    waste: pd.DataFrame | None = None  # WASTE_COLUMNS (own runs; None for the published logs)
    starts: pd.DataFrame | None = None  # START_COLUMNS (own runs; None for the published logs)

    def with_seeds(self, seeds) -> Results:
        """The same experiment restricted to the runs of `seeds`."""

        def keep(table):
            return None if table is None else table[table["seed"].isin(seeds)].reset_index(drop=True)

        return replace(
            self,
            evals=keep(self.evals),
            step_times=keep(self.step_times),
            waste=keep(self.waste),
            starts=keep(self.starts),
        )

    @property
    def arm_names(self) -> list[str]:
        return list(self.arms["arm"])

    def resolve(self, baseline: str | None, benchmark: str | None, metric: str | None) -> tuple[str, str, str]:
        """Fill in defaults and check that the baseline arm, benchmark and metric exist."""
        baseline = baseline or self.default_baseline or self.arm_names[0]
        benchmark = benchmark or self.default_benchmark
        metric = metric or self.default_metric
        if baseline not in self.arm_names:
            raise PodsBenchError(f"{self.name}: no arm named {baseline!r} (arms: {', '.join(self.arm_names)})")
        for what, value in (("benchmark", benchmark), ("metric", metric)):
            present = sorted(self.evals[what].unique())
            if value not in present:
                raise PodsBenchError(f"{self.name}: no {what} {value!r} (available: {', '.join(present)})")
        return baseline, benchmark, metric


def arm_table(rows: list[dict]) -> pd.DataFrame:
    """Arms sorted for display: GRPO-style arms (n == m) first, then by rule, n, and m from large to small."""
    arms = pd.DataFrame(rows, columns=ARM_COLUMNS).drop_duplicates("arm")
    rule_rank = arms["rule"].map({"all": 0, "max_variance": 1, "max_reward": 2, "random": 3}).fillna(4)
    key = arms.assign(_sel=arms["n"] != arms["m"], _rule=rule_rank, _m=-arms["m"])
    key = key.sort_values(["_sel", "_rule", "n", "_m", "arm"])
    return key.drop(columns=["_sel", "_rule", "_m"]).reset_index(drop=True)


def grpo_or_pods_name(n: int, m: int, rule: str = "max_variance", suffix: str = "") -> str:
    """Arm name for logs that only give (n, m, rule): GRPO when nothing is down-sampled."""
    if n == m:
        return f"GRPO{suffix}"
    tag = {"max_variance": "PODS", "max_reward": "PODS-MaxR", "random": "PODS-Rand"}.get(rule, f"PODS-{rule}")
    return f"{tag} n={n} m={m}{suffix}"
