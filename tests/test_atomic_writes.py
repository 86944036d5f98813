"""No reader ever sees a half-written result file.

1. Every place in the package (and the workflow's scripts) that writes a file goes through
   pods_bench/io.py's temp-file + rename writers, or is listed below with the reason it is safe.
2. A writer process that rewrites a JSON file, a CSV table and a PNG figure in a loop is killed with
   SIGKILL ten times at random moments while this process reads the three files as fast as it can:
   every read parses and is internally consistent, and after each kill the files hold a complete
   version. The same harness with plain (non-atomic) writes sees broken files, which shows that the
   check can fail.
"""

from __future__ import annotations

import ast
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from pods_bench.io import atomic_write_json, atomic_write_with, remove_temporaries

ROOT = Path(__file__).resolve().parents[1]

# --- 1. every writer is atomic -----------------------------------------------------------------

WRITER_METHODS = {
    "write_text",
    "write_bytes",
    "to_csv",
    "to_parquet",
    "to_json",
    "savefig",
    "dump",
    "save",
    "save_pretrained",
    "save_file",
}
# (file, enclosing function): why this write cannot leave a half-written result behind
SAFE_BY_DESIGN = {
    (
        "pods_bench/checkpoint.py",
        "save_checkpoint",
    ): "writes into checkpoints/.tmp-step-N/, renamed into place when complete",
    ("pods_bench/models.py", "save_model"): "callers write into a temporary folder and rename it (pretrain.py)",
    (
        "pods_bench/engines/vllm.py",
        "start_vllm_engine",
    ): "a scratch copy of the tiny model for vLLM to load, in a fresh temporary folder",
    (
        "pods_bench/model_sources.py",
        "convert",
    ): "writes into a .tmp- folder, renamed into place, then source.json (atomically) marks it complete",
    (
        "pods_bench/planning/measure_memory.py",
        "measure_here",
    ): "/proc/self/clear_refs is a kernel control, not a file: writing '5' resets the high-water mark",
    ("workflows/scripts/train_config.py", "<module>"): "the job's log file (a log, not a result)",
    ("workflows/scripts/manifest.py", "<module>"): "the job's log file (a log, not a result)",
}


def file_writes(path: Path) -> list[tuple[str, int, str]]:
    """(enclosing function, line, call) of each call that writes a file outside pods_bench/io.py's
    writers: `open(..., 'w'|'a'|'x')` and methods such as to_csv/savefig/write_text, unless the call
    sits in a lambda handed to `atomic_write_with`."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function: str, inside_atomic: bool):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "atomic_write_with":
                inside_atomic = True
            writes_mode = name == "open" and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str) and set(a.value) & set("wax")
                for a in node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]
            )
            if (writes_mode or name in WRITER_METHODS) and not inside_atomic:
                found.append((function, node.lineno, ast.unparse(node.func)))
        for child in ast.iter_child_nodes(node):
            visit(child, function, inside_atomic)

    visit(tree, "<module>", False)
    return found


def test_every_file_write_is_atomic_or_safe_by_design():
    sources = sorted((ROOT / "pods_bench").rglob("*.py")) + sorted((ROOT / "workflows/scripts").glob("*.py"))
    unsafe = []
    for path in sources:
        rel = path.relative_to(ROOT).as_posix()
        if rel == "pods_bench/io.py":
            continue
        for function, line, call in file_writes(path):
            if (rel, function) not in SAFE_BY_DESIGN:
                unsafe.append(f"{rel}:{line} {call} in {function}")
    assert not unsafe, "writes that bypass pods_bench/io.py:\n" + "\n".join(unsafe)
    # the scan finds writes at all (it would pass vacuously if it found none)
    assert file_writes(ROOT / "pods_bench/checkpoint.py") and file_writes(ROOT / "pods_bench/models.py")


# --- 2. kill -9 during writes --------------------------------------------------------------------

ROWS = 20_000


def write_versions(folder: Path, atomic: bool) -> None:
    """The writer process: rewrite data.json, table.csv and figure.png with version 1, 2, 3, ..."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    version = 0
    while True:
        version += 1
        record = {"version": version, "values": [version] * 100_000}
        table = pd.DataFrame({"version": version, "x": range(ROWS)})
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(range(1000), [i * version for i in range(1000)])
        if atomic:
            atomic_write_json(folder / "data.json", record)
            atomic_write_with(folder / "table.csv", lambda p: table.to_csv(p, index=False))
            atomic_write_with(folder / "figure.png", lambda p: fig.savefig(p, dpi=80))
        else:
            with open(folder / "data.json", "w") as f:
                json.dump(record, f)
            table.to_csv(folder / "table.csv", index=False)
            fig.savefig(folder / "figure.png", dpi=80)
        plt.close(fig)


def check_files(folder: Path) -> list[str]:
    """What is wrong with the three files as they are now (an empty list: all complete)."""
    problems = []
    try:
        record = json.loads((folder / "data.json").read_text())
        if record["values"] != [record["version"]] * 100_000:
            problems.append("data.json: inconsistent")
    except (ValueError, KeyError) as e:
        problems.append(f"data.json: {type(e).__name__}")
    try:
        table = pd.read_csv(folder / "table.csv")
        if len(table) != ROWS or table["version"].nunique() != 1:
            problems.append(f"table.csv: {len(table)} rows")
    except (ValueError, KeyError, pd.errors.ParserError) as e:
        problems.append(f"table.csv: {type(e).__name__}")
    try:
        with Image.open(folder / "figure.png") as image:
            image.load()  # decodes every byte: a truncated PNG fails here
    except (OSError, SyntaxError) as e:
        problems.append(f"figure.png: {type(e).__name__}")
    return problems


def hammer(folder: Path, atomic: bool, kills: int, seed: int) -> tuple[int, list[str]]:
    """Run the writer, read while it writes, SIGKILL it at random moments, restart it. Returns
    (number of reads, problems seen)."""
    rng = random.Random(seed)
    reads, problems = 0, []
    command = [sys.executable, __file__, "write", str(folder), "atomic" if atomic else "plain"]
    for _ in range(kills):
        writer = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE)
        while not all((folder / name).exists() for name in ("data.json", "table.csv", "figure.png")):
            assert writer.poll() is None, writer.stderr.read().decode()[-2000:]
            time.sleep(0.02)
        kill_at = time.monotonic() + rng.uniform(0.2, 1.5)
        while time.monotonic() < kill_at:
            problems += check_files(folder)
            reads += 1
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stderr.close()
        problems += [f"after kill: {p}" for p in check_files(folder)]
        reads += 1
    return reads, problems


@pytest.mark.slow
def test_readers_never_see_half_written_files_while_writers_are_killed(tmp_path):
    (tmp_path / "atomic").mkdir()
    reads, problems = hammer(tmp_path / "atomic", atomic=True, kills=10, seed=1)
    left = remove_temporaries(tmp_path / "atomic")
    print(
        f"\natomic writes: 10 kills, {reads} reads, {len(problems)} broken; {len(left)} temporary files left by kills, removed"
    )
    assert reads > 100 and problems == []
    assert check_files(tmp_path / "atomic") == []
    assert not [p for p in (tmp_path / "atomic").iterdir() if p.name.startswith(".")]

    # the control: plain writes, same harness
    (tmp_path / "plain").mkdir()
    reads, problems = hammer(tmp_path / "plain", atomic=False, kills=3, seed=1)
    print(f"plain writes: 3 kills, {reads} reads, {len(problems)} broken")
    assert problems, "the harness did not catch a single half-written plain file"


if __name__ == "__main__" and sys.argv[1:2] == ["write"]:
    write_versions(Path(sys.argv[2]), atomic=sys.argv[3] == "atomic")
