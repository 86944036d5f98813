"""Shared test fixtures.

Tests run offline: the hub is never contacted, datasets come from a local folder in the hub
datasets' own schema (`PODS_BENCH_DATA_DIR`, default `../shared/data` beside the project root).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("PODS_BENCH_DATA_DIR", PROJECT_ROOT.parent / "shared" / "data"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --- running in two worker processes (`make test`: pytest-xdist, one test file per worker) ------------

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... in a worker; None in a plain run
if XDIST_WORKER is not None:
    # Torch's OpenMP threads wait for each other by spinning, which burns the core a descheduled peer
    # thread needs as soon as the other worker is busy: a 2-thread pretraining of 24 s took 119 s
    # beside one busy core, 40 s with passive waiting (25 s alone). Inherited by every process a test
    # starts, workflow jobs included; it changes no result, only how idle threads wait.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(config, items):
    """Files with a slow test first, the rest after, each file's tests in their own order: the
    workers then start on the long files and finish on short ones, so neither is left with a long
    file at the end while the other idles. (A stable sort: both workers collect the same order.)"""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread_per_worker():
    """Two workers on two cores: each worker's own torch work gets one thread. Two torch threads per
    worker would stall each other as soon as the other worker is busy (OpenMP threads wait for a
    core the other process holds). Processes a test starts choose their own threads, as before."""
    if XDIST_WORKER is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], Path]) -> Path:
    """What `build(folder)` makes (a model folder, say), made once per test run. In a plain run the
    session fixture itself is the once; with workers, the first to ask builds it in the run's shared
    temporary folder while the others wait on a file lock, then all read where it is."""
    if XDIST_WORKER is None:
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # the run's folder, above each worker's own
    made = shared / f"{name}.path"
    with FileLock(str(shared / f"{name}.lock")):
        if not made.exists():
            (shared / name).mkdir(exist_ok=True)  # left by a worker whose build failed: build again
            made.write_text(str(build(shared / name)))
    return Path(made.read_text())


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.fail(f"local data folder {DATA_DIR} not found; set PODS_BENCH_DATA_DIR")
    return DATA_DIR


@pytest.fixture(autouse=True, scope="session")
def _isolated_hf_home(tmp_path_factory):
    """Keep the datasets/transformers caches of a test run out of the user's home."""
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf_home"))
    yield


@pytest.fixture(scope="session")
def smoke_model_dir(tmp_path_factory) -> Path:
    """A warm-started smoke model, built once per test session by `pods_bench.pretrain` on the
    `arith` task with a smaller model (hidden 64, 2 layers) than the smoke recipe's and no
    randomised-answer phase, so that it learns the task in ~30-40 s (sampled accuracy 0.3-0.5).
    Its settings are in `<dir>/pretrain.json`."""
    from pods_bench.models import TinyModelConfig
    from pods_bench.pretrain import PretrainConfig, pretrain

    cfg = PretrainConfig(
        model=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=192),
        steps=700,
        batch_size=32,
        warmup_steps=30,
        noise_share=0.0,
        # One thread: two threads stall each other (5-30x slower) as soon as another process is busy
        # on a 2-core machine; alone, one thread is only ~1.5-2x slower.
        threads=1,
    )
    return built_once(
        tmp_path_factory, "smoke_model", lambda folder: pretrain(cfg, folder / "arith-tiny", show_progress=False)[0]
    )


# The warm start the shortened workflow tests name (warm_start: {name: arith-tiny-test, steps: 60}),
# pretraining seed 0: what the workflow's warm_start rule builds for them.
TEST_WARM_START = {"name": "arith-tiny-test", "steps": 60}


@pytest.fixture(scope="session")
def warm_start_seed0(tmp_path_factory) -> Path:
    """The workflow tests' warm start (TEST_WARM_START, seed 0), built once per test run as the
    workflow's `pods-bench pretrain --steps 60 --seed 0` builds it. A test puts it in its workdir
    (`place_warm_start`) where building it again would only repeat work: Snakemake then takes the
    folder as made. The strategies test (its second warm start) and the SLURM test still build theirs
    through the workflow."""
    from dataclasses import replace

    from pods_bench.pretrain import PretrainConfig, pretrain

    cfg = replace(PretrainConfig(), steps=TEST_WARM_START["steps"], seed=0)
    return built_once(
        tmp_path_factory, "warm_start", lambda folder: pretrain(cfg, folder / "seed0", show_progress=False)[0]
    )


def place_warm_start(folder: Path, workdir: Path) -> Path:
    """Copy the built warm start where the workflow in `workdir` looks for it."""
    import shutil

    return Path(shutil.copytree(folder, workdir / "results" / "warm_start" / TEST_WARM_START["name"]))


# --- no leaked processes -------------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def _no_leaked_processes(request):
    """After each test module (and its fixtures) finishes, no process it started may be left:
    grading pools, engines and workflow jobs must all have been shut down."""
    from tests.processes import leftover_processes, still_running_after

    yield
    left = still_running_after(leftover_processes, 10.0)  # pools shut down asynchronously
    if left:
        described = []
        for p in left:
            try:
                described.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except Exception:
                described.append(str(p.pid))
        pytest.fail(f"{request.module.__name__} left processes running: {described}", pytrace=False)
