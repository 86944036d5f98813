"""`make mutation`: how many small wrong changes to a module its own tests catch (mutmut).

For each module below, a scratch copy of the project (git archive of HEAD, so only committed code)
gets a [tool.mutmut] section that mutates that module alone and runs that module's own test files
alone; mutmut then runs, for every mutant, the tests among those that cover the mutated function.
The score per module (killed / (killed + survived)) goes to docs/mutation-results/scores.csv and
the surviving mutants, as diffs, to docs/mutation-results/<module>.survivors.txt. Not part of CI:
it takes minutes per module on 2 cores.

    python scripts/mutation.py [--only pods_bench/selection.py ...] [--out docs/mutation-results]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pods_bench.io import atomic_write_text, atomic_write_with

ROOT = Path(__file__).resolve().parents[1]

# module (glob) -> its own test files: the ones written to check it
MODULES = {
    "pods_bench/selection.py": ["tests/test_selection.py"],
    "pods_bench/flops.py": ["tests/test_flops.py"],
    # tests/test_calibration.py trains real timed runs in subprocesses (about 2 min for its 3 tests, per
    # mutant); the mutation run uses the calibration's arithmetic and files, tested without training
    "pods_bench/calibration.py": ["tests/test_calibration_budget.py"],
    "pods_bench/analysis/speedup.py": ["tests/test_analysis_speedup.py"],
    "pods_bench/analysis/tables.py": [
        "tests/test_analysis_tables.py",
        "tests/test_analysis_runs.py",
        "tests/test_time_to_target.py",
    ],
    "pods_bench/allocation/*": ["tests/test_allocation.py"],
    "pods_bench/planning/profile.py": ["tests/test_planning_cli.py"],
    "pods_bench/sharding.py": ["tests/test_fsdp_gradients.py", "tests/test_sharded_optimizer.py"],
}


def mutmut_section(module: str, tests: list[str]) -> str:
    quoted = lambda items: "[" + ", ".join(f'"{x}"' for x in items) + "]"
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["pods_bench"]\n'
        f"only_mutate = {quoted([module])}\n"
        f"pytest_add_cli_args_test_selection = {quoted(tests)}\n"
        'also_copy = ["config", "workflows"]  # the experiment configs and their schema (mutmut copies only code and tests)\n'
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]\n'
        'process_isolation = "forkserver"  # torch is not fork-safe once imported\n'
    )


def run_module(module: str, tests: list[str], scratch: Path) -> dict:
    """Mutate `module` in a fresh copy of HEAD under `scratch`; (counts, survivors' diffs)."""
    copy = scratch / module.replace("/", "_").replace("*", "all")
    copy.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)
    with open(copy / "pyproject.toml", "a", encoding="utf-8") as f:
        f.write(mutmut_section(module, tests))
    # the tests read the data beside the project root, ../shared; mutmut runs them in <copy>/mutants/
    (copy / "shared").symlink_to(ROOT.parent / "shared")
    mutmut = [sys.executable, "-m", "mutmut"]
    subprocess.run([*mutmut, "run", "--max-children", str(os.cpu_count() or 1)], cwd=copy, check=False)
    listing = subprocess.run([*mutmut, "results", "--all", "true"], cwd=copy, capture_output=True, text=True).stdout
    status = dict(line.strip().rsplit(": ", 1) for line in listing.splitlines() if ": " in line)
    survivors = [name for name, s in status.items() if s == "survived"]
    diffs = [
        subprocess.run([*mutmut, "show", name], cwd=copy, capture_output=True, text=True).stdout for name in survivors
    ]
    counts = {s: sum(v == s for v in status.values()) for s in ("killed", "survived", "timeout", "not checked")}
    return {"counts": counts, "diffs": diffs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="modules of the list to run (default: all)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "mutation-results"))
    args = parser.parse_args(argv)
    unknown = set(args.only or []) - set(MODULES)
    if unknown:
        print(f"mutation: --only: not in the list: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pods-bench-mutation-") as scratch:
        for module in args.only or MODULES:
            result = run_module(module, MODULES[module], Path(scratch))
            c = result["counts"]
            tested = c["killed"] + c["timeout"] + c["survived"]
            score = 100 * (c["killed"] + c["timeout"]) / tested if tested else float("nan")
            row = {"module": module, "tests": " ".join(MODULES[module]), **c, "score_pct": round(score, 1)}
            name = module.replace("/", "_").replace("*", "all")
            atomic_write_text(out / f"{name}.survivors.txt", "\n".join(result["diffs"]))
            record_score(out / "scores.csv", row)  # each module as it ends: a stopped run keeps those done
            print(f"{module}: {score:.1f} % killed ({c})", flush=True)
    return 0


def record_score(scores: Path, row: dict) -> None:
    """`row` in place of its module's row of scores.csv, the rows in MODULES' order."""
    rows = {r["module"]: r for r in csv.DictReader(scores.open())} if scores.exists() else {}
    rows[row["module"]] = row

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            writer.writeheader()
            writer.writerows(rows[m] for m in MODULES if m in rows)

    atomic_write_with(scores, write)


if __name__ == "__main__":
    sys.exit(main())
