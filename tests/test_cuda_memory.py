"""The CUDA allocator's configuration (pods_bench/cuda_memory.py): expandable segments unless the user
configured the allocator, under either of torch's names for the setting. What the peaks record on a
GPU is checked in tests/test_cuda.py."""

from __future__ import annotations

import pytest

from pods_bench.cuda_memory import ALLOCATOR_CONFIG, ALLOCATOR_VARIABLES, configure_allocator, peaks_gib


@pytest.fixture
def clean_env(monkeypatch):
    for name in ALLOCATOR_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_expandable_segments_are_set_when_nothing_is(clean_env):
    import os

    assert configure_allocator() == "expandable_segments:True" == ALLOCATOR_CONFIG
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


@pytest.mark.parametrize("name", ALLOCATOR_VARIABLES)
def test_the_users_setting_is_kept(clean_env, name):
    import os

    clean_env.setenv(name, "max_split_size_mb:512")
    assert configure_allocator() == "max_split_size_mb:512"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ or name == "PYTORCH_CUDA_ALLOC_CONF"


def test_no_peaks_on_cpu():
    assert peaks_gib("cpu") == (None, None)
