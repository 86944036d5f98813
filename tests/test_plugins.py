"""A plugin with settings of its own is one file: a toy allocation strategy, a toy selection rule and
a toy rollout engine, each registered from this test file alone, get their config sections (typed,
checked, one-line errors) and train a real run; the strategy is gone again once unregistered. Each
receives its own settings, not the whole config."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from pods_bench.allocation import ALLOCATION_STRATEGIES, AllocationStrategy
from pods_bench.config import AllocationConfig, TrainConfig, config_from_dict
from pods_bench.engines import ENGINES
from pods_bench.engines.hf import HFEngine
from pods_bench.errors import PodsBenchError
from pods_bench.run_dir import read_run_json
from pods_bench.selection import SELECTION_RULES, choose
from pods_bench.train import train
from pods_bench.typed_config import section_from_dict
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
        stride = self.settings.stride
        drawn = sampler.draw(self.shape.prompts_per_step * stride)
        groups, everyone = sampler.sample(drawn[::stride], self.shape.n)
        return groups, {"num_gen_batches": 1, "groups_sampled": len(everyone)}


@pytest.fixture
def toy_strategy():
    ALLOCATION_STRATEGIES.register("every_other", settings=EveryOtherSettings)(EveryOther)
    yield
    ALLOCATION_STRATEGIES.unregister("every_other")


def test_a_strategy_registered_from_a_test_file_gets_its_config_section_and_trains(tmp_path, toy_strategy):
    cfg = config_from_dict(
        tiny_run(tmp_path / "run", allocation={"strategy": "every_other", "every_other": {"stride": 3}})
    )
    assert ALLOCATION_STRATEGIES.typed_settings(cfg.allocation) == EveryOtherSettings(stride=3)
    # run.json: the chosen strategy's settings in full, defaults filled in
    chosen = TrainConfig(allocation=AllocationConfig(strategy="every_other"))
    assert chosen.to_dict()["allocation"] == {"strategy": "every_other", "every_other": {"stride": 2}}
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


# --- a selection rule with a setting ----------------------------------------------------------


@dataclass
class SkipLowestSettings:
    skip: int = 0  # rewards passed over from the bottom before the m kept

    def __post_init__(self):
        if self.skip < 0:
            raise PodsBenchError("config key selection.skip_lowest.skip must be >= 0")


def skip_lowest(rewards, m, generator=None, settings=SkipLowestSettings()):
    """The m rewards after the `skip` lowest (equal rewards by rollout index)."""
    n = rewards.shape[1]
    if settings.skip + m > n:
        raise PodsBenchError(f"rule skip_lowest skips {settings.skip} and keeps {m}: more than n={n}")
    return torch.sort(rewards, dim=1, stable=True).indices[:, settings.skip : settings.skip + m]


@pytest.fixture
def toy_rule():
    SELECTION_RULES.register("skip_lowest", settings=SkipLowestSettings)(skip_lowest)
    yield
    SELECTION_RULES.unregister("skip_lowest")


def test_a_rule_registered_from_a_test_file_gets_its_config_section_and_trains(tmp_path, toy_rule):
    # skip n - m = 2 of 4: the 2 highest rewards train
    selection = {"rule": "skip_lowest", "n": 4, "m": 2, "skip_lowest": {"skip": 2}}
    cfg = config_from_dict(tiny_run(tmp_path / "run", selection=selection))
    assert SELECTION_RULES.typed_settings(cfg.selection) == SkipLowestSettings(skip=2)
    chosen = choose(torch.tensor([[0.3, 0.1, 0.4, 0.2], [1.0, 0.0, 1.0, 0.0]]), cfg.selection)
    assert chosen.cols.tolist() == [0, 2, 0, 2]  # rewards 0.3 and 0.4; the two 1.0s
    train(cfg, progress=False)
    assert read_run_json(tmp_path / "run")["config"]["selection"]["skip_lowest"] == {"skip": 2}
    steps = read_lines(tmp_path / "run" / "train_log.jsonl")
    assert len(steps) == 3 and all(r["reward_mean_kept"] >= r["reward_mean"] for r in steps)

    with pytest.raises(PodsBenchError, match=r"^config key selection.skip_lowest.skip must be >= 0$"):
        config_from_dict({"selection": {"skip_lowest": {"skip": -1}}, "budget": {"max_steps": 1}})
    with pytest.raises(PodsBenchError, match=r"^config key selection.m: rule skip_lowest skips 3 and keeps 2"):
        config_from_dict({"selection": selection | {"skip_lowest": {"skip": 3}}, "budget": {"max_steps": 1}})


# --- a rollout engine with an option ----------------------------------------------------------


@dataclass
class RowsPerCallOptions:
    rows_per_call: int = 4  # sequences handed to one generate call

    def __post_init__(self):
        if self.rows_per_call < 1:
            raise PodsBenchError("config key engine.options.rows_per_call must be >= 1")


class CountingHFEngine(HFEngine):
    """transformers generate, recording the rows of every call."""

    name = "counting_hf"
    started: list[CountingHFEngine] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[int] = []
        CountingHFEngine.started.append(self)

    def _generate_batch(self, rows, sampling):
        self.calls.append(len(rows))
        return super()._generate_batch(rows, sampling)


def start_counting_engine(setup, model, tokenizer) -> CountingHFEngine:
    options = section_from_dict(RowsPerCallOptions, setup.options, "engine.options")
    return CountingHFEngine(model, tokenizer, max_batch=options.rows_per_call)


@pytest.fixture
def toy_engine():
    ENGINES.register("counting_hf", settings=RowsPerCallOptions)(start_counting_engine)
    CountingHFEngine.started.clear()
    yield
    ENGINES.unregister("counting_hf")


def test_an_engine_registered_from_a_test_file_gets_its_options_and_trains(tmp_path, toy_engine):
    engine = {"name": "counting_hf", "options": {"rows_per_call": 3}}
    cfg = config_from_dict(tiny_run(tmp_path / "run", engine=engine))
    train(cfg, progress=False)
    assert len(read_lines(tmp_path / "run" / "train_log.jsonl")) == 3
    calls = [rows for e in CountingHFEngine.started for rows in e.calls]
    # 4 prompts x 4 rollouts a step in calls of at most 3 rows: 3, 3, 3, 3, 3, 1
    assert CountingHFEngine.started and calls.count(1) >= 3 and max(calls) == 3

    with pytest.raises(PodsBenchError, match=r"^config key engine.options.rows_per_call must be >= 1$"):
        config_from_dict(
            {"engine": {"name": "counting_hf", "options": {"rows_per_call": 0}}, "budget": {"max_steps": 1}}
        )
    with pytest.raises(
        PodsBenchError,
        match=r"^unknown config key engine.options.rows_per_cal \(did you mean engine.options.rows_per_call\?\)$",
    ):
        config_from_dict(
            {"engine": {"name": "counting_hf", "options": {"rows_per_cal": 2}}, "budget": {"max_steps": 1}}
        )
