"""Every registered subcommand shows up in `pods-bench --help` and has a working `--help`."""

import subprocess
import sys

import pytest

from pods_bench.cli import SUBCOMMANDS


def _run(*args):
    return subprocess.run([sys.executable, "-m", "pods_bench", *args], capture_output=True, text=True, timeout=120)


def test_top_level_help_lists_every_subcommand():
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    for name in SUBCOMMANDS:
        assert name in out.stdout


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_subcommand_help(name):
    out = _run(name, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: pods-bench " + name)


def test_unknown_subcommand_is_a_one_line_usage_error():
    out = _run("no-such-command")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "invalid choice" in out.stderr
