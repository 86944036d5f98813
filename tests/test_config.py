"""Training config: YAML + typed dotted overrides, validation with one-line errors, round trip."""

from __future__ import annotations

import json

import pytest

from pods_bench.config import TrainConfig, config_from_dict, load_config
from pods_bench.errors import PodsBenchError

BASE = {"task": {"name": "arith"}, "eval": {"benchmarks": ["arith"]}, "budget": {"max_steps": 5}}


def test_defaults_follow_the_paper_and_name_the_run_folder():
    cfg = config_from_dict(BASE)
    assert cfg.loss.beta == 0.0 and cfg.loss.aggregation == "sequence" and cfg.eval.temperature == 0.9
    assert (cfg.selection.rule, cfg.selection.n, cfg.selection.m) == ("max_variance", 16, 4)
    assert cfg.output_dir == "results/default/runs/pods/seed0"
    named = config_from_dict({**BASE, "experiment": "e1", "arm": "grpo", "seed": 3})
    assert str(named.run_dir) == "results/e1/runs/grpo/seed3"


def test_yaml_file_and_overrides_are_typed_by_field(tmp_path):
    path = tmp_path / "c.yaml"
    # PyYAML reads 1e-6 (no dot) as a string; a float field takes it as a number
    path.write_text("task: {name: arith}\neval: {benchmarks: [arith]}\nbudget: {max_steps: 5}\noptim: {lr: 1e-6}\n")
    cfg = load_config(
        path,
        [
            "selection.n=64",
            "selection.m=16",
            "optim.lr=3e-5",
            "lora.enabled=true",
            "eval.benchmarks=arith,arith",
            "eval.n_problems=null",
            "model.tiny.hidden_size=64",
            "task.system_prompt=Think: then answer",
            "optim.betas=[0.9, 0.95]",
            "engine.options={gpu_memory_utilization: 0.5}",
            "budget.max_train_time_s=120",
        ],
    )
    assert cfg.selection.n == 64 and cfg.selection.m == 16
    assert cfg.optim.lr == 3e-5 and isinstance(cfg.optim.lr, float)
    assert cfg.lora.enabled is True
    assert cfg.eval.benchmarks == ["arith", "arith"] and cfg.eval.n_problems is None
    assert cfg.model.tiny.hidden_size == 64
    assert cfg.task.system_prompt == "Think: then answer"
    assert cfg.optim.betas == (0.9, 0.95)
    assert cfg.engine.options == {"gpu_memory_utilization": 0.5}
    assert cfg.budget.max_train_time_s == 120.0
    assert load_config(path).optim.lr == 1e-6


def test_resolved_config_round_trips_through_json():
    cfg = config_from_dict({**BASE, "selection": {"rule": "all", "n": 8, "m": 8}, "lora": {"enabled": True}})
    again = config_from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and isinstance(again, TrainConfig)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["selection.m=32"], "selection.m (32) must be <= selection.n (16)"),
        (["selection.n=1", "selection.m=1"], "selection.n must be >= 2"),
        (["selection.rule=best"], "selection.rule: unknown rule 'best'"),
        (["selection.rule=all"], "selection.m: selection rule 'all' keeps every rollout"),
        (["engine.name=sglang"], "engine.name: unknown engine 'sglang'"),
        (["task.name=no-such-task"], "task.name:"),
        (["eval.benchmarks=arith,nope"], "eval.benchmarks[1]:"),
        (["selection.n=many"], "selection.n must be int, got 'many'"),
        (["lora.enabled=maybe"], "lora.enabled must be bool"),
        (["loss.aggregation=batch"], "loss.aggregation must be one of ['sequence', 'token', 'micro_batch_token']"),
        (["selection.nn=4"], "unknown config key selection.nn (did you mean selection.n?)"),
        (["no_such_section.x=1"], "unknown config key no_such_section"),
        (["selection.n"], "must look like key=value"),
        (["optim.schedule=cosine", "budget.max_steps=null", "budget.max_train_time_s=60"], "cosine decays over budget.max_steps"),
        (["budget.max_steps=null"], "budget: set max_train_time_s or max_steps"),
        (["sampling.temperature=0"], "sampling.temperature must be > 0"),
        (["optim.betas=[0.9]"], "optim.betas must have 2 items"),
        (["reward.workers=-1"], "config key reward: reward workers must be >= 0"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(overrides, message):
    with pytest.raises(PodsBenchError) as err:
        config_from_dict(BASE, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_files(tmp_path):
    with pytest.raises(PodsBenchError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(PodsBenchError, match="must hold a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "nested.yaml").write_text("selection: 4\n")
    with pytest.raises(PodsBenchError, match="config key selection must be a mapping"):
        load_config(tmp_path / "nested.yaml")
    (tmp_path / "unknown.yaml").write_text("task: {name: arith, splt: train}\n")
    with pytest.raises(PodsBenchError, match=r"unknown config key task.splt \(did you mean task.split\?\)"):
        load_config(tmp_path / "unknown.yaml")
