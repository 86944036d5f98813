"""Shared test fixtures.

Tests run offline: the hub is never contacted, datasets come from a local folder in the hub
datasets' own schema (`PODS_BENCH_DATA_DIR`, default `../shared/data` beside the project root).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("PODS_BENCH_DATA_DIR", PROJECT_ROOT.parent / "shared" / "data"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
    folder, _ = pretrain(cfg, tmp_path_factory.mktemp("smoke_model") / "arith-tiny", show_progress=False)
    return folder


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
    folder, _ = pretrain(cfg, tmp_path_factory.mktemp("warm_start") / "seed0", show_progress=False)
    return folder


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
