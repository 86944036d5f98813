"""`pods-bench aggregate` and `pods-bench plot`.

Inputs and outputs are explicit so that a workflow can declare them:
    pods-bench aggregate PATH [--out results]  -> <out>/<experiment>/summary/{speedups,curves,step_times}.csv,
                                                  speedups.md, speedups.tex
    pods-bench plot PATH [--out figures]       -> <out>/<experiment>/{accuracy,accuracy-<family>,length}.{png,pdf}
PATH is an experiment folder (results/<experiment>, holding runs/), a folder of experiment folders,
or the paper's published logs (one experiment per setting, e.g. gsm8k-l40s-qwen, h100-gsm8k).
"""

from __future__ import annotations

import sys

from pods_bench.analysis.figures import plot_experiment
from pods_bench.analysis.load import load_experiments
from pods_bench.analysis.tables import AnalysisOptions, format_speedup, format_time, summarize, write_summary
from pods_bench.analysis.time_to_target import knee_target
from pods_bench.errors import PodsBenchError


def _summaries(args, n_bootstrap: int):
    experiments, warnings = load_experiments(args.path, kind=args.kind, only=args.experiment)
    for warning in warnings:
        print(f"pods-bench: warning: {warning}", file=sys.stderr)
    options = AnalysisOptions(
        baseline=args.baseline,
        q=args.q,
        benchmark=args.benchmark,
        metric=args.metric,
        n_bootstrap=n_bootstrap,
        seed=args.seed,
        target=getattr(args, "target", None),
    )
    # every experiment is summarised before anything is written, so that bad input for one of them
    # (say, a --baseline it lacks) fails the command without leaving the others' files rewritten
    return [summarize(exp, options) for exp in experiments]


def _report(summary) -> None:
    unit = summary.time_unit
    for _, r in summary.speedups.iterrows():
        if not r["is_baseline"]:
            t = format_time(r["t_arm_s"], unit)
            print(
                f"  {r['arm']}: speedup {format_speedup(r)} (T = {r['threshold'] * 100:.2f} %, "
                f"{summary.baseline} {format_time(r['t_baseline_s'], unit)} vs {t})"
            )


def cli_aggregate(args) -> int:
    for summary in _summaries(args, args.bootstrap):
        print(f"{summary.experiment.name}: {summary.benchmark} {summary.metric}, baseline {summary.baseline}")
        _report(summary)
        for path in write_summary(summary, args.out):
            print(f"  wrote {path}")
    return 0


def cli_target(args) -> int:
    experiments, warnings = load_experiments(args.path, kind="runs")
    for warning in warnings:
        print(f"pods-bench: warning: {warning}", file=sys.stderr)
    if len(experiments) != 1:
        raise PodsBenchError(f"{args.path}: {len(experiments)} experiments; give the folder of one (results/<name>)")
    exp = experiments[0]
    arm, benchmark, metric = exp.resolve(args.arm, args.benchmark, args.metric)
    target = knee_target(exp, arm, benchmark, metric, args.seeds)
    print(
        f"{exp.name}: {arm}, seeds {list(target.reference_seeds)}, {benchmark} {metric}: knee at "
        f"{target.knee_time_s:.0f} s, mean curve at the next checkpoint ({target.at_time_s:.0f} s)"
        + (", lowered to the lowest reference peak" if target.capped else "")
    )
    print(f"analysis: {{target: {target.value:.4f}}}")
    return 0


def cli_plot(args) -> int:
    for summary in _summaries(args, n_bootstrap=0):  # figures show point estimates and seed bands
        print(f"{summary.experiment.name}: {summary.benchmark} {summary.metric}, baseline {summary.baseline}")
        for path in plot_experiment(summary, args.out):
            print(f"  wrote {path}")
    return 0
