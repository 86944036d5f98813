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
