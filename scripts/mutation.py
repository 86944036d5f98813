"""`make mutation`: how many small wrong changes to a module its own tests catch (mutmut).

For each module below, a scratch copy of the project (git archive of HEAD, so only committed code)
gets a [tool.mutmut] section that mutates that module alone and runs that module's own test files
alone; mutmut then runs, for every mutant, the tests among those that cover the mutated function.
The score per module (killed / (killed + survived)) goes to docs/mutation-results/scores.csv and
the surviving mutants, as diffs, to docs/mutation-results/<module>.survivors.txt. Not part of CI:
it takes minutes per module on 2 cores.

mutmut records only the calls made in its own process, so it never runs a test whose code runs in
processes the test starts (torchrun, accelerate launch). For the modules of OTHER_PROCESS_TESTS,
each mutant the in-process tests let survive is then run against those tests too, switched on in
every process they start (see other_process_pass); the ones they catch count as killed, and
scores.csv says how many.

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
    # the in-process tests only (the others run it on several processes: OTHER_PROCESS_TESTS)
    "pods_bench/sharding.py": [
        "tests/test_fsdp_gradients.py::test_one_process_shards_gathers_and_hands_back_the_whole_weights_and_optimizer_state",
        "tests/test_fsdp_gradients.py::test_one_process_float32_compute_and_the_whole_gradient_a_pass_without_reduce_scatter_leaves",
    ],
}

# module -> {its functions: the tests that run them in processes they start}; an in-process survivor
# in one of those functions is run against those tests (about a minute each)
OTHER_PROCESS_TESTS = {
    "pods_bench/sharding.py": {
        # the sharded update on two and three processes: the gradient held between passes, the float32 reduce
        ("shard", "_fully_shard", "gradient_bytes", "total_norm"): ["tests/test_fsdp_gradients.py"],
        # start-up, checkpoint and resume on two processes: rank 0 reads and saves, the other receives
        (
            "shard_from_rank0",
            "full_model_state",
            "full_optimizer_state",
            "load_optimizer_state",
            "broadcast_object",
        ): ["tests/test_fsdp_resume.py"],
    },
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
    caught = set()
    if module in OTHER_PROCESS_TESTS and survivors:
        caught = other_process_pass(copy / "mutants", survivors, OTHER_PROCESS_TESTS[module])
        diffs = [d for name, d in zip(survivors, diffs) if name not in caught]
    counts["killed"] += len(caught)
    counts["survived"] -= len(caught)
    counts["of which in other processes"] = len(caught)
    return {"counts": counts, "diffs": diffs}


def other_process_pass(mutants: Path, survivors: list[str], tests_of: dict) -> set[str]:
    """The survivors that the tests of their function (`tests_of`) catch, each mutant switched on in
    the pytest process and every process it starts: mutmut's trampolines read the mutant's name from
    MUTANT_UNDER_TEST, and PYTHONPATH puts the mutated copy first. Each set of tests first runs with
    no mutant switched on and must pass, or every mutant would look caught."""
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key
    from tqdm import tqdm

    def fails(tests: list[str], mutant: str) -> bool:
        env = {**os.environ, "MUTANT_UNDER_TEST": mutant, "PYTHONPATH": str(mutants)}
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        return subprocess.run(command, cwd=mutants, env=env, capture_output=True).returncode != 0

    function = lambda mutant: orig_function_and_class_names_from_key(mutant)[0]  # mutmut's own name parsing
    tests_for = {name: tests for names, tests in tests_of.items() for name in names}
    for tests in tests_of.values():
        if fails(tests, ""):
            raise SystemExit(f"mutation: {' '.join(tests)} fail in {mutants} with no mutant switched on")
    rerun = [m for m in survivors if function(m) in tests_for]
    return {m for m in tqdm(rerun, desc="other processes", unit="mutant") if fails(tests_for[function(m)], m)}


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
            writer = csv.DictWriter(f, fieldnames=list(row), restval=0)  # a column added since: 0 in older rows
            writer.writeheader()
            writer.writerows(rows[m] for m in MODULES if m in rows)

    atomic_write_with(scores, write)


if __name__ == "__main__":
    sys.exit(main())
