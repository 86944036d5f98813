"""The `pods-bench` command line.

Each subcommand is one entry in `SUBCOMMANDS`: a function that declares its arguments and a handler
that imports its module lazily (so `pods-bench --help` does not pay for importing torch).
Bad input raises `PodsBenchError`; here it becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from pods_bench.errors import PodsBenchError

# name -> (help text, add_arguments(parser), run(args) -> int | None)
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int | None]]] = {}


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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args._handler(args)
    except PodsBenchError as e:
        print(f"pods-bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pods-bench: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
