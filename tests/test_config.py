"""Training config: YAML + typed dotted overrides, validation with one-line errors, round trip."""

from __future__ import annotations

import json

import pytest

from pods_bench.config import BudgetConfig, EvalConfig, SelectionConfig, TrainConfig, config_from_dict, load_config
from pods_bench.engines.base import SamplingConfig
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


def test_a_strategy_section_is_kept_as_given_typed_when_checked_and_recorded_in_full():
    """allocation.<strategy> is the mapping given (YAML or --set alike), typed by the registry's settings
    dataclass when the config is checked; run.json holds the chosen strategy's settings in full and
    the other sections as given, and reads back to the same settings."""
    from pods_bench.allocation import ALLOCATION_STRATEGIES
    from pods_bench.allocation.vigor import VigorConfig

    data = {**BASE, "prompts_per_step": 4, "selection": {"n": 4, "m": 2}}
    cfg = config_from_dict(data, ["allocation.strategy=vigor", "allocation.vigor.rounds=2", "allocation.hora={}"])
    assert cfg.allocation.sections == {"vigor": {"rounds": 2}, "hora": {}}
    assert ALLOCATION_STRATEGIES.typed_settings(cfg.allocation) == VigorConfig(rounds=2)
    recorded = cfg.to_dict()["allocation"]
    assert recorded == {"strategy": "vigor", "vigor": {**VigorConfig(rounds=2).__dict__}, "hora": {}}
    again = config_from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert ALLOCATION_STRATEGIES.typed_settings(again.allocation) == VigorConfig(rounds=2)
    with pytest.raises(PodsBenchError, match=r"^config key allocation.vigor.keep_share must be in \(0, 1\]$"):
        config_from_dict(data, ["allocation.vigor.keep_share=2"])  # a section not chosen is checked too


def test_resume_compares_the_settings_of_the_strategy_and_rule_the_run_uses(tmp_path):
    """A run.json written when every registered strategy's section was recorded with its defaults
    still resumes; a changed setting of the chosen strategy does not."""
    from dataclasses import asdict

    from pods_bench.allocation import ALLOCATION_STRATEGIES
    from pods_bench.resume import check_same_run

    data = {**BASE, "prompts_per_step": 4, "selection": {"n": 4, "m": 2}, "output_dir": str(tmp_path)}
    cfg = config_from_dict(data, ["allocation.strategy=vigor", "allocation.vigor.rounds=2"])
    old = json.loads(json.dumps(cfg.to_dict()))  # run.json
    for name, settings in ALLOCATION_STRATEGIES.settings().items():
        old["allocation"].setdefault(name, asdict(settings()))
    check_same_run({"config": old}, cfg)
    old["allocation"]["vigor"]["rounds"] = 3
    with pytest.raises(PodsBenchError, match=r"another config \(allocation.vigor.rounds: 3 there, 2 now\)"):
        check_same_run({"config": old}, cfg)


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
        (["allocation.vigr.rounds=2"], "unknown config key allocation.vigr (did you mean allocation.vigor?)"),
        (
            ["allocation.vigor.rund=2"],
            "unknown config key allocation.vigor.rund (did you mean allocation.vigor.rounds?)",
        ),
        (["selection.max_variance.x=1"], "unknown config key selection.max_variance"),
        (["no_such_section.x=1"], "unknown config key no_such_section"),
        (["selection.n"], "must look like key=value"),
        (
            ["optim.schedule=cosine", "budget.max_steps=null", "budget.max_train_time_s=60"],
            "cosine decays over budget.max_steps",
        ),
        (["budget.max_steps=null"], "budget: set max_train_time_s or max_steps"),
        (["sampling.temperature=0"], "sampling.temperature must be > 0"),
        (["optim.betas=[0.9]"], "optim.betas must have 2 items"),
        (["reward.workers=-1"], "config key reward: reward workers must be >= 0"),
        (
            ["task.prompt_date=09 Sep 2025"],
            "config key task.prompt_date must be a date as YYYY-MM-DD, got '09 Sep 2025'",
        ),
        (
            ["model.attn_implementation=flash"],
            "model.attn_implementation must be one of ['sdpa', 'eager', 'flash_attention_2']",
        ),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(overrides, message):
    with pytest.raises(PodsBenchError) as err:
        config_from_dict(BASE, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


VLLM = ["engine.name=vllm"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            VLLM + ["engine.options={gpu_memory_utilisation: 0.5}"],
            "unknown config key engine.options.gpu_memory_utilisation (did you mean engine.options.gpu_memory_utilization?)",
        ),
        # a vllm.EngineArgs field that is not an option of its own goes under llm_kwargs
        (
            VLLM + ["engine.options={max_num_batched_tokens: 128}"],
            "unknown config key engine.options.max_num_batched_tokens (allowed here: cache_dir, cpu_kv_cache_gib, dtype, "
            "enable_prefix_caching, enforce_eager, gpu_memory_utilization, llm_kwargs, max_model_len, max_num_seqs; "
            "other vllm.EngineArgs fields go under engine.options.llm_kwargs)",
        ),
        (
            VLLM + ["engine.options={gpu_memory_utilization: half}"],
            "config key engine.options.gpu_memory_utilization must be float, got 'half'",
        ),
        (
            VLLM + ["engine.options={llm_kwargs: 128}"],
            "config key engine.options.llm_kwargs must be a mapping, got 128",
        ),
    ],
)
def test_vllm_options_are_checked_at_load(overrides, message):
    with pytest.raises(PodsBenchError) as err:
        config_from_dict(BASE, overrides)
    assert str(err.value) == message


def test_vllm_options_as_given_and_ignored_by_other_engines():
    options = {"gpu_memory_utilization": 0.5, "llm_kwargs": {"max_num_batched_tokens": 128}}
    cfg = config_from_dict({**BASE, "engine": {"name": "vllm", "options": options}})
    assert cfg.engine.options == options  # run.json records what was set
    # a vllm recipe switched to hf (as tests and CPU runs do) keeps its options, unused
    hf = config_from_dict({**BASE, "engine": {"name": "hf", "options": {"block_size": 16}}})
    assert hf.engine.options == {"block_size": 16}


def test_sections_check_their_own_fields_wherever_they_are_built():
    """The same one-line error from code as from a config file; validate() adds only what spans sections."""
    for build, message in [
        (lambda: SelectionConfig(n=4, m=8), "config key selection.m (8) must be <= selection.n (4)"),
        (lambda: EvalConfig(repeats=0), "config key eval.repeats must be >= 1"),
        (lambda: SamplingConfig(top_p=0.0), "config key sampling.top_p must be in (0, 1]"),
        (lambda: TrainConfig(seed=-1), "config key seed must be >= 0, got -1"),
    ]:
        with pytest.raises(PodsBenchError) as err:
            build()
        assert str(err.value) == message
    # left to validate(): a run's budget (the default has none) and checks across sections
    assert TrainConfig().budget == BudgetConfig()
    assert SamplingConfig(temperature=0.0).temperature == 0.0  # greedy: evaluation samples with it


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


def test_selection_m_may_equal_n_and_no_more_by_outcome():
    """selection.m <= selection.n at its boundary, as outcomes: m = n (GRPO keeps every rollout) is a
    config with the values given, m = n + 1 the one-line refusal naming both keys."""

    def outcome(n: int, m: int):
        try:
            s = SelectionConfig(n=n, m=m)
        except PodsBenchError as e:
            return str(e)
        return (s.n, s.m)

    assert [outcome(n, m) for n, m in [(2, 2), (8, 8), (8, 7), (8, 9), (2, 3)]] == [
        (2, 2),
        (8, 8),
        (8, 7),
        "config key selection.m (9) must be <= selection.n (8)",
        "config key selection.m (3) must be <= selection.n (2)",
    ]
