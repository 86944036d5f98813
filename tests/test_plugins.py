"""A plugin with settings of its own is one file: a toy allocation strategy registered from this test
file alone gets its config section (typed, checked, one-line errors), trains a real run, and is gone
again once unregistered."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pods_bench.allocation import ALLOCATION_STRATEGIES, AllocationStrategy
from pods_bench.config import TrainConfig, config_from_dict
from pods_bench.errors import PodsBenchError
from pods_bench.train import train
from tests.tiny_runs import read_lines, tiny_run


@dataclass
class EveryOtherSettings:
    stride: int = 2  # train on every stride-th prompt of the stream

    def __post_init__(self):
        if self.stride < 1:
            raise PodsBenchError("config key allocation.every_other.stride must be >= 1")


class EveryOther(AllocationStrategy):
    """P prompts, taking every `stride`-th prompt of the stream (the ones between are consumed)."""

    def collect(self, sampler):
        stride = self.cfg.allocation.every_other.stride
        drawn = sampler.draw(self.cfg.prompts_per_step * stride)
        groups, everyone = sampler.sample(drawn[::stride], self.cfg.selection.n)
        return groups, {"rounds": 1, "groups_sampled": len(everyone)}


@pytest.fixture
def toy_strategy():
    ALLOCATION_STRATEGIES.register("every_other", settings=EveryOtherSettings)(EveryOther)
    yield
    ALLOCATION_STRATEGIES.unregister("every_other")


def test_a_strategy_registered_from_a_test_file_gets_its_config_section_and_trains(tmp_path, toy_strategy):
    cfg = config_from_dict(
        tiny_run(tmp_path / "run", allocation={"strategy": "every_other", "every_other": {"stride": 3}})
    )
    assert cfg.allocation.every_other == EveryOtherSettings(stride=3)
    assert TrainConfig().to_dict()["allocation"]["every_other"] == {"stride": 2}  # in run.json with defaults
    train(cfg, progress=False)
    steps = read_lines(tmp_path / "run" / "train_log.jsonl")
    assert [r["allocation"] for r in steps] == ["every_other"] * 3
    assert all(r["groups_trained"] == 4 and r["rollouts_generated"] == 4 * 4 for r in steps)

    with pytest.raises(PodsBenchError, match=r"^config key allocation.every_other.stride must be >= 1$"):
        config_from_dict({"allocation": {"every_other": {"stride": 0}}, "budget": {"max_steps": 1}})
    with pytest.raises(PodsBenchError, match=r"^unknown config key allocation.every_other.strid \(did you mean"):
        config_from_dict({"allocation": {"every_other": {"strid": 2}}, "budget": {"max_steps": 1}})


def test_an_unregistered_strategy_and_its_section_are_gone(toy_strategy):
    assert "every_other" in ALLOCATION_STRATEGIES
    ALLOCATION_STRATEGIES.unregister("every_other")
    try:
        with pytest.raises(PodsBenchError, match="unknown strategy 'every_other'; choose from uniform, dynamic"):
            config_from_dict({"allocation": {"strategy": "every_other"}, "budget": {"max_steps": 1}})
        with pytest.raises(PodsBenchError, match="unknown config key allocation.every_other"):
            config_from_dict({"allocation": {"every_other": {}}, "budget": {"max_steps": 1}})
    finally:  # the fixture unregisters it again
        ALLOCATION_STRATEGIES.register("every_other", settings=EveryOtherSettings)(EveryOther)
