"""The `pods-bench` command line.

Each subcommand is one entry in `SUBCOMMANDS`: a function that declares its arguments and a handler
that imports its module lazily (so `pods-bench --help` does not pay for importing torch).
Bad input raises `PodsBenchError`; here it becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable

from pods_bench.errors import PodsBenchError

# name -> (help text, add_arguments(parser), run(args) -> int | None)
SUBCOMMANDS: dict[
    str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int | None]]
] = {}


def subcommand(name: str, help: str):
    """Register `run` under `name`; the decorated function declares the arguments and returns
    the handler."""

    def register(add_arguments):
        def run(args):
            return args._handler(args)

        SUBCOMMANDS[name] = (help, add_arguments, run)
        return add_arguments

    return register


# --- subcommands -----------------------------------------------------------------------------
# Keep each block small: declare arguments, then hand over to the module that does the work.


@subcommand("tasks", "list the benchmark tasks, or show a few prompts and gold answers of one")
def _tasks(p: argparse.ArgumentParser):
    p.add_argument("task", nargs="?", help="task name (omit to list all)")
    p.add_argument("--split", default="test")
    p.add_argument("--data-dir", default=None, help="local folder of <task>/<split>.jsonl[.gz] (default: the hub)")
    p.add_argument("--limit", type=int, default=3)

    def handler(args):
        from pods_bench import tasks

        return tasks.cli_show(args)

    p.set_defaults(_handler=handler)


@subcommand(
    "model", "resolve a model.name: convert a GGUF file (gguf:<file>, package:<pkg>/<file>) once, print its folder"
)
def _model(p: argparse.ArgumentParser):
    p.add_argument("name", help="a model.name value")

    def handler(args):
        from pods_bench.model_sources import resolve

        source = resolve(args.name)
        print(source.path)
        if source.record:
            print(f"converted from {source.record['file']} (sha256 {source.record['sha256']})")

    p.set_defaults(_handler=handler)


@subcommand("train", "train one run (GRPO or GRPO-PODS); rerun the same command to resume it")
def _train(p: argparse.ArgumentParser):
    p.add_argument("--config", help="YAML file of config keys (see pods_bench/config.py)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. selection.n=64 (repeatable)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handler(args):
        from pods_bench.config import load_config
        from pods_bench.train import train

        run_dir = train(load_config(args.config, args.set), progress=not args.no_progress)
        print(run_dir)

    p.set_defaults(_handler=handler)


@subcommand("pass-rates", "per-prompt pass rates of a config's policy on its training prompts -> <out>/pass_rates.*")
def _pass_rates(p: argparse.ArgumentParser):
    p.add_argument("--config", help="a trainer config (e.g. results/smoke/configs/train.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--prompts", type=int, default=500, help="the first N training prompts")
    p.add_argument("--rollouts", type=int, default=16, help="completions sampled per prompt")
    p.add_argument("--out", required=True, help="folder for pass_rates.csv and pass_rates.md")

    def handler(args):
        from pods_bench import pass_rates
        from pods_bench.config import load_config

        if args.prompts < 1 or args.rollouts < 1:
            raise PodsBenchError("--prompts and --rollouts must be >= 1")
        counts = pass_rates.sample_pass_counts(load_config(args.config, args.set), args.prompts, args.rollouts)
        pass_rates.write(counts, args.rollouts, args.out)
        print(pass_rates.summary(counts, args.rollouts), end="")

    p.set_defaults(_handler=handler)


@subcommand("evaluate", "evaluate every checkpoint of a run that lacks an eval record")
def _evaluate(p: argparse.ArgumentParser):
    p.add_argument("run_dir", help="a run folder (results/<experiment>/runs/<arm>/seed<k>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the run's config, e.g. eval.n_problems=100",
    )

    def handler(args):
        from pods_bench.cuda_memory import configure_allocator
        from pods_bench.evaluate import evaluate_run

        configure_allocator()  # before anything touches CUDA
        print(f"{evaluate_run(args.run_dir, args.set)} eval records written to {args.run_dir}")

    p.set_defaults(_handler=handler)


def _analysis_arguments(p: argparse.ArgumentParser, out: str) -> None:
    """Arguments shared by `aggregate` and `plot`."""
    p.add_argument(
        "path", help="an experiment folder (results/<experiment>), a folder of them, or the paper's published logs"
    )
    p.add_argument(
        "--kind", choices=["auto", "runs", "paper"], default="auto", help="what PATH holds (default: detect)"
    )
    p.add_argument("--experiment", action="append", help="only this experiment / published setting (repeatable)")
    p.add_argument("--baseline", help="baseline arm (default: the GRPO arm)")
    p.add_argument("--q", type=float, default=0.99, help="threshold T = q x the baseline's peak (default 0.99)")
    p.add_argument("--benchmark", help="benchmark of the speedup (default: the setting's, e.g. gsm8k)")
    p.add_argument("--metric", help="answer_acc, both_acc or format_acc (default: the setting's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    p.add_argument("--out", default=out, help=f"output root (default: {out}/)")


@subcommand(
    "aggregate", "time-to-peak speedups with bootstrap CIs, curves and step times -> <out>/<experiment>/summary/"
)
def _aggregate(p: argparse.ArgumentParser):
    _analysis_arguments(p, out="results")
    p.add_argument("--bootstrap", type=int, default=9999, help="bootstrap resamples (0: no CIs)")
    p.add_argument(
        "--target",
        type=float,
        help="fixed target accuracy of the MLPerf-style table mlperf.md (from `pods-bench target`; default: none)",
    )

    def handler(args):
        from pods_bench.analysis import commands

        return commands.cli_aggregate(args)

    p.set_defaults(_handler=handler)


@subcommand("plot", "accuracy, step-time and completion-length figures -> <out>/<experiment>/*.png|pdf")
def _plot(p: argparse.ArgumentParser):
    _analysis_arguments(p, out="figures")

    def handler(args):
        from pods_bench.analysis import commands

        return commands.cli_plot(args)

    p.set_defaults(_handler=handler)


@subcommand(
    "target", "the fixed target of an MLPerf-style comparison, from reference runs of the baseline (their knee)"
)
def _target(p: argparse.ArgumentParser):
    p.add_argument("path", help="an experiment folder (results/<experiment>) holding the reference runs")
    p.add_argument("--arm", help="the reference arm (default: the experiment's GRPO arm)")
    p.add_argument("--seeds", type=int, nargs="+", help="the reference runs' seeds (default: all of the arm's)")
    p.add_argument("--benchmark", help="benchmark (default: the experiment's)")
    p.add_argument("--metric", default="answer_acc", help="answer_acc, both_acc or format_acc (default answer_acc)")

    def handler(args):
        from pods_bench.analysis import commands

        return commands.cli_target(args)

    p.set_defaults(_handler=handler)


@subcommand(
    "pretrain", "build the warm-started tiny smoke model (reused if OUT already holds one with the same settings)"
)
def _pretrain(p: argparse.ArgumentParser):
    p.add_argument("--out", required=True, help="model folder to write (a Hugging Face folder + pretrain.json)")
    p.add_argument(
        "--steps", type=int, help="optimizer steps (default: the smoke recipe's, see pods_bench/pretrain.py)"
    )
    p.add_argument(
        "--seconds", type=float, help="wall-clock cap on training; stops at steps or seconds, whichever first"
    )
    p.add_argument("--seed", type=int, help="initialisation and data-order seed (default 0)")

    def handler(args):
        from pods_bench.pretrain import cli_pretrain

        return cli_pretrain(args)

    p.set_defaults(_handler=handler)


@subcommand("plan", "memory per device and step time of every arm of an experiment config, on any hardware setup")
def _plan(p: argparse.ArgumentParser):
    p.add_argument("config", help="an experiment config (config/<experiment>.yaml)")
    p.add_argument("--hardware", help="a setup of config/hardware.yaml (default: the config's own)")
    p.add_argument(
        "--model", help="a step-time model written by `pods-bench profile` (default: the hardware profile's)"
    )
    p.add_argument("--out", help="also write the plan as CSV here")

    def handler(args):
        from pods_bench.planning.plan import cli

        return cli(args)

    p.set_defaults(_handler=handler)


@subcommand("calibrate", "time a few steps of the baseline arm here: the budget of N of its steps, in seconds")
def _calibrate(p: argparse.ArgumentParser):
    p.add_argument(
        "--config", required=True, help="the shared trainer settings (results/<experiment>/configs/train.yaml)"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the baseline arm's overrides")
    p.add_argument("--steps", type=int, required=True, help="the budget, in the baseline's steps")
    p.add_argument("--checkpoints", type=int, default=12, help="checkpoints over the budget (default 12)")
    p.add_argument("--timed-steps", type=int, default=3, help="steps timed after two untimed ones (default 3)")
    p.add_argument(
        "--side-by-side", type=int, default=1, help="timed runs trained at once, as many as the arms train at once"
    )
    p.add_argument("--out", required=True, help="folder for calibration.json, train.yaml and the timed runs")

    def handler(args):
        from pods_bench.calibration import cli

        return cli(args)

    p.set_defaults(_handler=handler)


@subcommand("profile", "a few interleaved steps of every arm on this machine, fitted into a step-time model")
def _profile(p: argparse.ArgumentParser):
    p.add_argument("config", help="an experiment config (config/<experiment>.yaml)")
    p.add_argument("--out", required=True, help="folder for the runs, step_time_model.json and validation.*")
    p.add_argument("--fit", help="comma-separated arms to fit on (default: all); the others are predicted")
    p.add_argument("--steps", type=int, default=12, help="timed steps per arm (default 12)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds the steps are split into (default 3)")
    p.add_argument(
        "--memory", action="store_true", help="also measure every arm's update memory against the plan (Linux)"
    )

    def handler(args):
        from pods_bench.planning.profile import cli

        return cli(args)

    p.set_defaults(_handler=handler)


@subcommand(
    "project", "a finished experiment's time-to-target projected onto another hardware setup (labelled a projection)"
)
def _project(p: argparse.ArgumentParser):
    p.add_argument("results", help="an experiment folder (results/<experiment>) or the published logs")
    p.add_argument("--config", required=True, help="the experiment config its arms came from (matched by n and m)")
    p.add_argument("--hardware", required=True, help="the setup of config/hardware.yaml to project onto")
    p.add_argument("--model", help="a step-time model for the target (default: its hardware profile)")
    p.add_argument("--q", type=float, default=0.99, help="threshold T = q x the baseline's peak (default 0.99)")
    p.add_argument("--kind", choices=["auto", "runs", "paper"], default="auto")
    p.add_argument("--experiment", action="append", help="only this experiment / published setting (repeatable)")
    p.add_argument("--out", help="also write the rows as CSV here")

    def handler(args):
        from pods_bench.planning.project import cli

        return cli(args)

    p.set_defaults(_handler=handler)


@subcommand(
    "gpu-check",
    "the prepared GPU check: CUDA tests, smoke training, paper-scale steps, the 8-GPU recipe's process sharded "
    "at world size 1, vs the plan -> <out>/gpu_check.*",
)
def _gpu_check(p: argparse.ArgumentParser):
    p.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    p.add_argument(
        "--device", choices=["auto", "cuda", "cpu"], default="auto", help="cpu: tiny shapes (default: cuda if visible)"
    )

    def handler(args):
        from pods_bench.gpu_check import cli

        return cli(args)

    p.set_defaults(_handler=handler)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pods-bench",
        description="GRPO vs GRPO-PODS: train, evaluate, and measure time-to-peak speedups.",
    )
    from pods_bench import __version__

    parser.add_argument("--version", action="version", version=f"pods-bench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, _run) in SUBCOMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


class Terminated(BaseException):
    """SIGTERM (what schedulers such as Slurm send before SIGKILL) turned into an exception, so that
    `finally` blocks run: grading processes are shut down and run.json says "stopped"."""


def _raise_terminated(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()  # where handlers live
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        rc = args._handler(args)
    except PodsBenchError as e:
        print(f"pods-bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pods-bench: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("pods-bench: terminated (SIGTERM)", file=sys.stderr)
        return 143
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
