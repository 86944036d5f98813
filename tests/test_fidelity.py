"""Conformance of the paper configs with the authors' runs, knob by knob.

Every row names a setting group, a trainer config key (or an experiment-config key, `experiment:<key>`),
the value the authors' code used with its source (github.com/YixuanEvenXu/pods, commit:path:line),
and whether pods-bench runs the same value or deliberately another one (then `ours` and why). The
tests check four things:
  - every paper config, resolved exactly as the workflow's training jobs get them
    (pods_bench/experiment.py), runs the value its row states;
  - every cited line exists in the authors' file at the cited commit and shows the authors' value
    (`shows`: text those lines must contain), read from byte-identical copies of the cited files in
    PODS_BENCH_UPSTREAM_DIR (default ../shared/upstream/<repo>@<commit>/<path>, see its SOURCES.md);
  - every row's official value follows from the text of its cited lines: a number or word found there,
    or read from them by the row's READINGS entry (NOT_READ lists the row no copied file shows);
  - every config key that changes the loss, sampling, evaluation or the clock has a row for every
    paper setting where it acts (NOT_RESULT_KNOBS lists the others, each with its reason).
docs/fidelity.md's table is generated from ROWS; after changing a row or a config, regenerate it with
    .venv/bin/python -m tests.test_fidelity
Commits: 3fc107e (release: every Qwen single-GPU result), 0c453d2 (the Llama runs), 9459b96 (open-r1/,
the 8-GPU code), 187f43b (the A100 logs and plot scripts). TRL@1bca495 is the TRL the 8-GPU code pins.
"""

from __future__ import annotations

import csv
import dataclasses
import inspect
import math
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from pods_bench.config import TrainConfig, config_from_dict, plugin_registries, validate
from pods_bench.errors import PodsBenchError
from pods_bench.experiment import load_experiment, resolve_arms
from pods_bench.rewards.recipes import RECIPE_FIELDS, REWARD_RECIPES
from tests.test_workflow import CONFIG_DIR, PROJECT_ROOT

DOC = PROJECT_ROOT / "docs" / "fidelity.md"
UPSTREAM = Path(os.environ.get("PODS_BENCH_UPSTREAM_DIR", PROJECT_ROOT.parent / "shared" / "upstream"))
DATA = Path(os.environ.get("PODS_BENCH_DATA_DIR", PROJECT_ROOT.parent / "shared" / "data"))
QWEN_L40S = ("gsm8k_main", "math_main", "gsm8k_n_scaling", "gsm8k_m_scaling", "rule_ablation")
L40S = QWEN_L40S + ("llama_gsm8k",)
GSM8K_L40S = ("gsm8k_main", "gsm8k_n_scaling", "gsm8k_m_scaling", "rule_ablation", "llama_gsm8k")
GPU8 = ("h100x8", "a100x8")
PAPER = L40S + GPU8
GROUP_NAMES = {
    QWEN_L40S: "L40S, Qwen (5 configs)",
    L40S: "L40S (all 6)",
    GSM8K_L40S: "L40S, GSM8K (5 configs)",
    GPU8: "8-GPU (h100x8, a100x8)",
}
SAME = "same"  # Row.ours of a row whose official value pods-bench runs as it is


@dataclass(frozen=True)
class Row:
    settings: tuple[str, ...]
    key: str  # trainer config key, or "experiment:<key>"
    official: Any  # a value, or {arm: value}
    source: str  # commit:path:Lx[-y][,Lz] citations (a later path without commit: the same commit)
    ours: Any = SAME  # deviations: what pods-bench runs instead (checked)
    why: str = ""  # deviations: the reason and the expected effect
    describe: str = field(default="", compare=False)  # official value in words, where it is no config value
    shows: tuple[str, ...] = ()  # text the cited lines contain: the authors' value as their files write it
    # the authors' value is one this key cannot take (checked: the config refuses it), so the
    # deviation is forced; False for the rows whose official value is a config value
    not_offered: bool = False
    same_rule_as: Any = None  # the config value that implements the authors' rule where it is no config value
    status_note: str = ""  # the status shown instead of "same" / "deviation: why"

    @property
    def status(self) -> str:
        return "same" if self.ours == SAME and self.same_rule_as is None else "deviation"

    @property
    def id(self) -> str:
        return f"{'+'.join(self.settings)}:{self.key}"


S = "3fc107e:"  # single-GPU sources
R1 = "9459b96:open-r1/"  # 8-GPU sources
T = "TRL@1bca495:trl/trainer/grpo_config.py:"
R1_TRAINER = R1 + "src/open_r1/grpo_trainer.py:"
R1_RECIPE = R1 + "recipes/Qwen2.5-3B-Instruct/config_pods.yaml:"
PLOT = "187f43b:scripts/plot.py:"
SAMPLING_PARAMS = S + "trainer/maxvargrpo_trainer.py:L310-314"  # SamplingParams(n, temperature, max_tokens)
EVAL_PARAMS = S + "utils/eval.py:L13-16"  # SamplingParams(temperature, max_tokens)
GENERATION_CONFIG = R1_TRAINER + "L653-665"  # the 8-GPU GenerationConfig, for training and evaluation

# the single-GPU arms: (plot.py lines, {arm: run name}); a run name is
# Instruct-<DATASET>[-<RULE>]-<max completion length>-<n>-<m>[-<beta>] (MaxR: max-reward, Rand: random)
SINGLE_GPU_ARMS = {
    "gsm8k_main": ("L63-64", {"grpo_n16_m16": "Instruct-GSM8K-512-16-16", "pods_n64_m16": "Instruct-GSM8K-512-64-16"}),
    "math_main": ("L78-79", {"grpo_n8_m8": "Instruct-MATH-NF-512-8-8", "pods_n32_m8": "Instruct-MATH-NF-512-32-8"}),
    "gsm8k_n_scaling": (
        "L28-32",
        {f"{'grpo' if n == 16 else 'pods'}_n{n}_m16": f"Instruct-GSM8K-512-{n}-16" for n in (16, 32, 64, 128, 256)},
    ),
    "gsm8k_m_scaling": ("L46-49", {f"pods_n64_m{m}": f"Instruct-GSM8K-512-64-{m}" for m in (16, 8, 4, 2)}),
    "rule_ablation": (
        "L93-95",
        {
            "maxvar_n64_m16": "Instruct-GSM8K-512-64-16",
            "maxreward_n64_m16": "Instruct-GSM8K-MaxR-512-64-16",
            "random_n64_m16": "Instruct-GSM8K-Rand-512-64-16",
        },
    ),
    "llama_gsm8k": (
        "L109-110",
        {"grpo_n16_m16": "Instruct-Llama-512-16-16-0.04", "pods_n64_m16": "Instruct-Llama-512-64-16-0.04"},
    ),
}
RULE_OF_RUN_NAME = {"MaxR": "max_reward", "Rand": "random"}  # no tag: MaxVarGRPO (config/train.yaml:L22)


def run_name_values(name: str) -> dict:
    """selection.rule, n and m as a single-GPU run name states them (n = m keeps all: rule 'all')."""
    parts = name.split("-")
    i = parts.index("512")
    n, m = int(parts[i + 1]), int(parts[i + 2])
    rule = "all" if n == m else RULE_OF_RUN_NAME.get(parts[i - 1], "max_variance")
    return {"selection.rule": rule, "selection.n": n, "selection.m": m}


def single_gpu_arm_rows() -> list[Row]:
    return [
        Row(
            (experiment,),
            key,
            {arm: run_name_values(name)[key] for arm, name in names.items()},
            PLOT + lines + " run names: <n>-<m>; MaxR / Rand name the rule, none: max-variance (n = m: all)",
            shows=tuple(f"'{name}'" for name in names.values()),
        )
        for experiment, (lines, names) in SINGLE_GPU_ARMS.items()
        for key in ("selection.rule", "selection.n", "selection.m")
    ]


# the m kept rollouts of each single-GPU arm, as its run name states them
KEPT_PER_ARM = {
    arm: run_name_values(name)["selection.m"] for _, names in SINGLE_GPU_ARMS.values() for arm, name in names.items()
}

ROWS = [
    # --- single GPU: batch, model, precision
    Row(
        L40S,
        "prompts_per_step",
        1,
        S + "config/train.yaml:L46-47 per_device_train_batch_size 1, no accumulation",
        shows=("per_device_train_batch_size: 1", "gradient_accumulation_steps: 1"),
    ),
    Row(
        L40S,
        "allocation.strategy",
        "uniform",
        SAMPLING_PARAMS + " n rollouts of each prompt, every step (no filter, no rounds)",
        shows=("n=self.num_generations_reward",),
    ),
    Row(
        L40S,
        "selection.groups_per_prompt",
        1,
        S + "trainer/maxvargrpo_trainer.py:L515-533 (one group of n per prompt)",
        shows=("rewards.sort(descending=True)", "view(-1, self.num_generations_grad)"),
    ),
    *single_gpu_arm_rows(),
    Row(
        L40S,
        "selection.filter_uniform_groups",
        False,
        S + "trainer/maxvargrpo_trainer.py:L527-533 (every group trains, all-equal ones too)",
        shows=("advantages = (rewards - mean_grouped_rewards)",),
    ),
    Row(
        L40S,
        "selection.advantage_over",
        "kept",
        S + "trainer/maxvargrpo_trainer.py:L528-533 (mean and std over the kept m)",
        shows=("rewards = rewards[indices]", "std_grouped_rewards = rewards.view(-1, self.num_generations_grad)"),
    ),
    Row(
        L40S,
        "selection.scope",
        "group",
        S + "trainer/maxvargrpo_trainer.py:L515-525 (m of each group's n)",
        shows=("indices = sorted_indices[:self.num_generations_grad]",),
    ),
    Row(
        QWEN_L40S,
        "model.name",
        "Qwen/Qwen2.5-3B-Instruct",
        S + "config/train.yaml:L2",
        shows=('model_name: "Qwen/Qwen2.5-3B-Instruct"',),
    ),
    Row(
        ("llama_gsm8k",),
        "model.name",
        "meta-llama/Llama-3.2-3B-Instruct",
        "0c453d2: run names Instruct-Llama-*; the checkpoint is named in no file (chat template of Llama 3.x, paper)",
    ),
    Row(
        L40S,
        "model.dtype",
        "4bit",
        S + "config/train.yaml:L6 load_in_4bit",
        ours="bfloat16",
        why="bitsandbytes 4-bit weights and 8-bit AdamW are not offered yet: the update rule is the same, memory "
        "is higher, and step time differs (4-bit matmuls dequantize on the fly, 8-bit AdamW steps faster), so "
        "the time axis of the L40S figures is not reproduced exactly (docs/fidelity.md)",
        describe="4-bit NF4 base (Unsloth), 8-bit AdamW (config/train.yaml:L39)",
        shows=("load_in_4bit: true",),
        not_offered=True,
    ),
    Row(
        L40S,
        "model.mixed_precision",
        "bf16",
        S + "train.py:L85-86 bf16 = is_bfloat16_supported()",
        shows=("bf16 = is_bfloat16_supported()",),
    ),
    Row(
        L40S,
        "model.attn_implementation",
        "Unsloth's kernels",
        S + "train.py:L27 FastLanguageModel.from_pretrained",
        ours="sdpa",
        why="part of the Unsloth deviation (model.dtype): Unsloth patches the model with its own attention and "
        "MLP kernels; pods-bench runs transformers' model with PyTorch's scaled-dot-product attention. The same "
        "exact attention, at a different speed",
        shows=("FastLanguageModel.from_pretrained(**pretrained_args)",),
    ),
    Row(
        L40S,
        "optim.shard_optimizer_state",
        False,
        S + "config/train.yaml:L39 (one process: nothing to shard; 8-bit AdamW, see model.dtype)",
        shows=('optim: "adamw_8bit"',),
    ),
    Row(
        L40S,
        "model.gradient_checkpointing",
        True,
        S + 'train.py:L32 use_gradient_checkpointing="unsloth"',
        shows=('"use_gradient_checkpointing": "unsloth"',),
    ),
    Row(
        L40S,
        "lora.enabled",
        True,
        S + "train.py:L28-35 FastLanguageModel.get_peft_model",
        shows=("model = FastLanguageModel.get_peft_model(model, **peft_args)",),
    ),
    Row(L40S, "lora.r", 64, S + "config/train.yaml:L5", shows=("lora_rank: 64",)),
    Row(
        L40S,
        "lora.alpha",
        64,
        S + "train.py:L29-33 lora_alpha = lora_rank",
        shows=('"lora_alpha": cfg.model.lora_rank',),
    ),
    Row(L40S, "lora.dropout", 0.0, "unsloth 2025.2.4, models/llama.py line 2030: default lora_dropout = 0"),
    Row(
        L40S,
        "lora.target_modules",
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        S + "config/train.yaml:L8-15",
        shows=tuple(f'- "{m}"' for m in ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    ),
    # --- single GPU: optimizer
    Row(L40S, "optim.lr", 5e-6, S + "config/train.yaml:L36", shows=("learning_rate: 5e-6",)),
    Row(L40S, "optim.schedule", "constant", S + "config/train.yaml:L37", shows=('lr_scheduler_type: "constant"',)),
    Row(
        L40S,
        "optim.warmup_steps",
        0,
        S + "config/train.yaml:L43 warmup_ratio 0.01, inert under 'constant'",
        shows=("warmup_ratio: 0.01",),
    ),
    Row(L40S, "optim.weight_decay", 0.1, S + "config/train.yaml:L42", shows=("weight_decay: 0.1",)),
    Row(
        L40S, "optim.betas", (0.9, 0.99), S + "config/train.yaml:L40-41", shows=("adam_beta1: 0.9", "adam_beta2: 0.99")
    ),
    Row(L40S, "optim.max_grad_norm", 0.1, S + "config/train.yaml:L45", shows=("max_grad_norm: 0.1",)),
    Row(
        L40S,
        "optim.micro_batch_size",
        KEPT_PER_ARM,
        S + "trainer/maxvargrpo_trainer.py:L586-588 (the m kept rollouts of the step in one forward and backward)",
        ours=4,
        why="four rows per forward/backward pass (gradients accumulate over the step: the same update), to fit "
        "a bf16 base instead of the authors' 4-bit one beside vLLM on one L40S (`pods-bench plan`); the update "
        "takes m / 4 smaller passes, so its time per step differs from the authors' single pass",
        describe="all m kept rollouts of the step (16; 8 on MATH) in one pass",
        shows=("per_token_loss = torch.exp(per_token_logps - per_token_logps.detach())",),
    ),
    # --- single GPU: loss
    Row(QWEN_L40S, "loss.beta", 0.0, S + "config/train.yaml:L34", shows=("beta: 0.0",)),
    Row(
        ("llama_gsm8k",),
        "loss.beta",
        0.04,
        PLOT + "L109-110 run names Instruct-Llama-512-*-0.04 (no committed config holds it)",
        shows=("-0.04'",),
    ),
    Row(
        L40S,
        "loss.reference_forward",
        True,
        S + "trainer/maxvargrpo_trainer.py:L543-552 (reference log-probs of the m kept rollouts every step, also "
        "at beta 0; the trainer's clock includes them)",
        shows=("ref_per_token_logps = self._get_per_token_logps(", "disable_adapter()"),
    ),
    Row(
        L40S,
        "loss.aggregation",
        "sequence",
        S + "trainer/maxvargrpo_trainer.py:L588 per-sequence token mean, then mean",
        shows=("completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()",),
    ),
    Row(
        L40S,
        "loss.divide_logits_by_temperature",
        False,
        S + "trainer/maxvargrpo_trainer.py:L361-378 (raw logits)",
        shows=("logits = logits[:, :-1, :]", "token_log_probs = token_logits - logsumexp_values"),
    ),
    Row(
        L40S,
        "optim.updates_per_batch",
        1,
        S + "trainer/maxvargrpo_trainer.py:L586 ratio exp(logp - logp.detach())",
        shows=("torch.exp(per_token_logps - per_token_logps.detach())",),
    ),
    Row(
        L40S,
        "selection.scale_advantage_by_std",
        True,
        S + "trainer/maxvargrpo_trainer.py:L528-533 (r - mean) / (std + 1e-4)",
        shows=("/ (std_grouped_rewards + 1e-4)",),
    ),
    # --- single GPU: sampling
    Row(L40S, "engine.name", "vllm", S + "config/train.yaml:L38 use_vllm", shows=("use_vllm: true",)),
    Row(
        L40S,
        "engine.options",
        {"gpu_memory_utilization": 0.5},
        S + "config/train.yaml:L3; train.py:L20-27 (vLLM's share of the GPU memory: its KV cache)",
        shows=("gpu_memory_utilization: 0.5", '"gpu_memory_utilization": cfg.model.gpu_memory_utilization'),
    ),
    Row(
        L40S,
        "sampling.temperature",
        0.9,
        S + "config/train.yaml:L44; trainer/maxvargrpo_trainer.py:L310-314",
        shows=("temperature: 0.9", "temperature=args.temperature"),
    ),
    Row(L40S, "sampling.top_p", 1.0, SAMPLING_PARAMS + " (vLLM default)", shows=("SamplingParams(",)),
    Row(L40S, "sampling.top_k", 0, SAMPLING_PARAMS + " (vLLM default -1: off)", shows=("SamplingParams(",)),
    Row(L40S, "sampling.min_p", 0.0, SAMPLING_PARAMS + " (vLLM default)", shows=("SamplingParams(",)),
    Row(L40S, "sampling.repetition_penalty", 1.0, SAMPLING_PARAMS + " (vLLM default)", shows=("SamplingParams(",)),
    Row(L40S, "sampling.max_new_tokens", 512, S + "config/train.yaml:L25", shows=("max_completion_length: 512",)),
    # --- single GPU: task and prompt
    Row(GSM8K_L40S, "task.name", "gsm8k", S + "config/train.yaml:L23", shows=('dataset: "gsm8k"',)),
    Row(
        ("math_main",),
        "task.name",
        "math",
        PLOT + "L78-79 run names Instruct-MATH-NF-* (config/train.yaml names gsm8k: set on the command line)",
        shows=("'Instruct-MATH-NF-512-8-8'",),
    ),
    Row(L40S, "task.split", "train", S + "train.py:L39-40", shows=('split = "train"',)),
    Row(L40S, "task.limit", None, S + "train.py:L39-40 (the whole split)", shows=("get_questions(cfg.rl.dataset",)),
    Row(
        L40S,
        "task.prompt_style",
        "instruct",
        S + "train.py:L39-40 (Instruct models get the chat template)",
        shows=('style = "instruct" if cfg.model.model_name[-8:] == "Instruct"',),
    ),
    Row(
        L40S,
        "task.system_prompt",
        None,
        S + "utils/data.py:L25-37 SYSTEM_PROMPT_INSTRUCT (pods-bench's instruct prompt, verbatim)",
        describe="SYSTEM_PROMPT_INSTRUCT",
        shows=("SYSTEM_PROMPT_INSTRUCT = ", "You will be given a math question."),
    ),
    Row(
        ("llama_gsm8k",),
        "task.prompt_date",
        "2025-09-09",
        "0c453d2: the prompts stored with the Llama results print 'Today Date: 09 Sep 2025' (the chat "
        "template's date is the day the runs were made)",
    ),
    Row(
        L40S,
        "task.max_prompt_tokens",
        512,
        S + "config/train.yaml:L24; utils/data.py:L70-74",
        shows=("max_prompt_length: 512", "tokenized_prompt['input_ids'].shape[1] <= 512"),
    ),
    # --- single GPU: rewards and grading
    Row(
        ("gsm8k_main", "gsm8k_n_scaling", "gsm8k_m_scaling", "rule_ablation"),
        "reward.recipe",
        "pods-gsm8k",
        S + "train.py:L95-97; utils/data.py:L52-62,L239-269",
        shows=("format_reward_func, xmlcount_reward_func", "0.1 - 0.001", "count += 0.025"),
    ),
    Row(
        ("math_main",),
        "reward.recipe",
        "pods-math-nf",
        S + "train.py:L95-97 (correctness only for MATH)",
        shows=("reward_funcs = [correctness_reward_func]", 'if cfg.rl.dataset == "gsm8k":'),
    ),
    Row(
        ("llama_gsm8k",),
        "reward.recipe",
        "pods-llama",
        "0c453d2:train.py:L97; utils/data.py:L60,L74,L260,L283",
        shows=(
            "reward_funcs = [correctness_reward_func, format_reward_func, xmlcount_reward_func]",
            "0.01 * format_score(r)",
            "0.01 * count_xml(r)",
            "1 - 0.01 *",
            "numbers = re.findall",
        ),
    ),
    Row(
        QWEN_L40S,
        "reward.grading",
        "string-normalising grader",
        S + "utils/data.py:L8-9,L52-55; utils/grader.py:L233-287",
        describe="any of (whole text, <answer> block, last integer) equal to the gold",
        shows=(
            "# from math_verify import",
            "extract_xml_answer(text), extract_last_integer(text)",
            "def grade_answer",
        ),
        same_rule_as="released-1gpu",
        status_note="same rule, other engine (docs/grading-agreement.md)",
    ),
    Row(
        ("llama_gsm8k",),
        "reward.grading",
        "string-normalising grader",
        "0c453d2:utils/data.py:L60",
        describe="as the Qwen runs, with the Llama code's last-number extraction",
        shows=(r'numbers = re.findall(r"[\d\.\,]+", text)',),
        same_rule_as="released-1gpu-llama",
        status_note="same rule, other engine (docs/grading-agreement.md)",
    ),
    Row(
        ("math_main",),
        "task.math_gold",
        "released",
        S + "utils/data.py:L134-140 (cut at the first '}')",
        ours="balanced",
        why="a bug: 1,728 of 7,500 MATH train problems (23 %) get a truncated gold (\\frac{1}{2} -> \\frac{1}) and can "
        "never score; pods-bench trains on the real golds (more problems give signal, both arms alike); "
        "task.math_gold: released replicates it",
        shows=('answer = answer.split("}")[0]',),
    ),
    # --- single GPU: budget and evaluation
    Row(QWEN_L40S, "budget.max_train_time_s", 21600, S + "config/train.yaml:L33 max_time", shows=("max_time: 21600",)),
    Row(
        L40S,
        "budget.max_steps",
        8000,
        S + "config/train.yaml:L29",
        ours=None,
        why="never reached: 8,000 steps in 6 h would take 2.7 s each, and the published GSM8K runs took 8.2 s "
        "(GRPO) and 10.2 s (PODS) per step (2,649 and 2,122 steps in 6 h); the time budget alone stops the run",
        shows=("max_steps: 8000",),
    ),
    Row(
        QWEN_L40S,
        "budget.checkpoint_every_s",
        1800,
        S + "config/train.yaml:L30,L32 save every 30 min",
        shows=('save_strategy: "time"', "save_interval: 1800"),
    ),
    Row(
        L40S,
        "budget.checkpoint_every_steps",
        None,
        S + "config/train.yaml:L30-31 (save_strategy time: save_steps unused)",
        shows=('save_strategy: "time"',),
    ),
    Row(
        ("llama_gsm8k",),
        "budget.max_train_time_s",
        7200,
        "0c453d2: 12 checkpoints per Llama result file (a 2 h run); scripts/plot.py setting 6 plots 1.5 h",
        ours=5400,
        why="the runs stop at the 1.5 h the paper's Llama figure and speed-up use; the last half hour is never plotted",
    ),
    Row(
        ("llama_gsm8k",),
        "budget.checkpoint_every_s",
        600,
        PLOT + "L106-119 ckpt_int 1/6 h",
        shows=("ckpt_int    = 1/6",),
    ),
    Row(
        QWEN_L40S[:1] + QWEN_L40S[2:] + ("llama_gsm8k",),
        "eval.benchmarks",
        ["amc23", "gsm8k", "math500"],
        S + "config/test.yaml:L3-6",
        shows=('- "amc23"', '- "gsm8k"', '- "math500"'),
    ),
    Row(
        ("math_main",),
        "eval.benchmarks",
        ["amc23", "gsm8k", "math500"],
        S + "config/test.yaml:L3-6",
        shows=('- "amc23"', '- "gsm8k"', '- "math500"'),
    ),
    Row(L40S, "eval.split", "test", S + "utils/eval.py:L121", shows=('split="test"',)),
    Row(
        L40S,
        "eval.n_problems",
        None,
        S + "utils/eval.py:L31,L35 (every problem)",
        shows=("total_queries = len(prompts)",),
    ),
    Row(L40S, "eval.repeats", 5, S + "config/test.yaml:L12 repeat_cnt", shows=("repeat_cnt: 5",)),
    Row(
        L40S,
        "eval.temperature",
        0.9,
        S + "config/test.yaml:L8; utils/eval.py:L13-16",
        shows=("temperature: 0.9", "temperature = cfg.temperature"),
    ),
    Row(
        L40S,
        "eval.top_p",
        1.0,
        EVAL_PARAMS + " SamplingParams(temperature, max_tokens): vLLM default",
        shows=("SamplingParams(",),
    ),
    Row(
        L40S,
        "eval.top_k",
        0,
        EVAL_PARAMS + " SamplingParams(temperature, max_tokens): vLLM defaults",
        shows=("SamplingParams(",),
    ),
    Row(L40S, "eval.min_p", 0.0, EVAL_PARAMS + " vLLM default", shows=("SamplingParams(",)),
    Row(L40S, "eval.repetition_penalty", 1.0, EVAL_PARAMS + " vLLM default", shows=("SamplingParams(",)),
    Row(L40S, "eval.max_new_tokens", 512, S + "config/test.yaml:L9", shows=("max_tokens: 512",)),
    Row(
        L40S,
        "eval.max_prompt_tokens",
        512,
        S + "utils/data.py:L70-74,L194 (496 of MATH-500's 500 kept)",
        shows=("<= 512", "data.filter(filter_function"),
    ),
    Row(
        L40S,
        "eval.inline",
        False,
        S + "utils/eval.py:L79-128 test_model: every checkpoint, after training",
        shows=("def test_model(",),
    ),
    Row(
        L40S,
        "experiment:seeds",
        [42] * 10,
        S + "config/train.yaml:L16 (LoRA init); train.py:L75-94 (no seed set: TrainingArguments' default 42 orders "
        "the data)",
        ours=list(range(1, 11)),
        why="the official runs differed only by GPU non-determinism; distinct seeds make the 10 runs independent "
        "samples, which the bootstrap intervals assume",
        describe="42 for every run: LoRA initialisation (random_state) and data order",
        shows=("random_state: 42", "training_args = Config("),
    ),
    # --- 8 GPUs: batch semantics
    Row(
        GPU8,
        "prompts_per_step",
        8,
        R1_TRAINER + "L775-776 RepeatSampler batch_size = processes; exp.sh:L11 NP=8",
        shows=("batch_size=num_procs", "NP=8"),
    ),
    Row(
        GPU8,
        "allocation.strategy",
        "uniform",
        R1_TRAINER + "L775-776 (each prompt sampled n x gas times, every step)",
        shows=("mini_repeat_count=n*gas",),
    ),
    Row(
        GPU8,
        "selection.n",
        {"grpo_n32_m32": 32, "pods_n128_m32": 128},
        R1 + "exp.sh:L15-21 --pods_full_size 32 / 128",
        shows=("--pods_full_size=128", "--pods_full_size=32"),
    ),
    Row(
        GPU8,
        "selection.m",
        {"grpo_n32_m32": 32, "pods_n128_m32": 32},
        R1 + "exp.sh:L12 NG=32 (num_generations = m)",
        shows=("NG=32",),
    ),
    Row(
        GPU8,
        "selection.rule",
        {"grpo_n32_m32": "all", "pods_n128_m32": "max_variance (published loop)"},
        R1_TRAINER + "L1106-1117 (indices is a view of sorted_indices: the loop writes into the sort)",
        ours={"grpo_n32_m32": "all", "pods_n128_m32": "max_variance"},
        why="the published loop updates `indices`, a view of `sorted_indices`, in place, so after a group's first "
        "improving split every later candidate repeats it: it keeps the top m, the bottom m or the first split "
        "that beats the top m, not the most varied subset the paper describes (tests/benchmarks/"
        "test_bench_selection.py). pods-bench keeps the exact maximiser. On synthetic rewards shaped like "
        "open-r1's (accuracy + format + tag count), n = 128, m = 32, every group kept less variance than the "
        "optimum, 16 % of it on average; with 0/1 rewards 74 % of groups, 47 %",
        describe="grpo: n = m keeps all; pods: the max-variance loop as published",
        shows=("indices = sorted_indices[:, :self.num_generations]", "indices[max_mask] = _indices[max_mask]"),
        not_offered=True,
    ),
    Row(
        GPU8,
        "selection.groups_per_prompt",
        {"grpo_n32_m32": 16, "pods_n128_m32": 4},
        R1 + "exp.sh:L15-21 --gradient_accumulation_steps 16 / 4; src/open_r1/grpo_trainer.py:L775,L1104,L1128-1136",
        shows=(
            "--gradient_accumulation_steps=4",
            "--gradient_accumulation_steps=16",
            "mini_repeat_count=n*gas",
            "view(-1, self.pods_full_size)",
            "view(-1, self.num_generations)",
        ),
    ),
    Row(
        GPU8,
        "selection.filter_uniform_groups",
        False,
        R1_TRAINER + "L1128-1136 (every group trains)",
        shows=("advantages = rewards - mean_grouped_rewards",),
    ),
    Row(
        GPU8,
        "selection.advantage_over",
        "kept",
        R1_TRAINER + "L1117,L1128-1129 (mean and std over the kept m)",
        shows=("rewards = rewards.gather(1, indices).view(-1)", "rewards.view(-1, self.num_generations).mean(dim=1)"),
    ),
    Row(
        GPU8,
        "selection.scope",
        "group",
        R1_TRAINER + "L1104-1108 (m of each group's n)",
        shows=("rewards.detach().view(-1, self.pods_full_size)",),
    ),
    Row(
        GPU8,
        "optim.micro_batch_size",
        32,
        R1_TRAINER + "L915-916 split_tensor_dict(batch, gas): one group",
        shows=("split_tensor_dict(", "accumulated_local_batch, self.args.gradient_accumulation_steps"),
    ),
    # --- 8 GPUs: model and precision (a100x8 runs the same 3B recipe: no 7B recipe was committed)
    Row(
        ("h100x8",),
        "model.name",
        "Qwen/Qwen2.5-3B-Instruct",
        R1_RECIPE + "L2",
        shows=("model_name_or_path: Qwen/Qwen2.5-3B-Instruct",),
    ),
    Row(
        ("a100x8",),
        "model.name",
        "a 7B model (run names GR7B-*)",
        "187f43b:scripts/plot-a100s.py:L30-31",
        ours="Qwen/Qwen2.5-7B-Instruct",
        why="no 7B recipe or launch line was committed, so every other a100x8 row is the 3B H100 recipe's; the "
        "Qwen2.5 family of the other runs at 7B is the reading of 'GR7B' (checked: config/models.yaml gives it "
        "7.6B parameters)",
        shows=(r"GR7B-s\d+-p8-n32-m32-ga16", r"GR7B-s\d+-p8-n128-m32-ga4"),
    ),
    Row(
        GPU8,
        "model.dtype",
        "float32",
        R1 + "exp.sh:L8 recipes/accelerate_configs/zero2.yaml:L13 (ZeRO-2 bf16 keeps fp32 master weights)",
        shows=("ACC_CFG=recipes/accelerate_configs/zero2.yaml", "mixed_precision: bf16"),
    ),
    Row(
        GPU8,
        "model.mixed_precision",
        "bf16",
        R1 + "recipes/accelerate_configs/zero2.yaml:L13; recipes/Qwen2.5-3B-Instruct/config_pods.yaml:L15",
        shows=("mixed_precision: bf16", "bf16: true"),
    ),
    Row(
        GPU8,
        "model.attn_implementation",
        "flash_attention_2",
        R1_RECIPE + "L5",
        ours="sdpa",
        why="flash-attn is a CUDA build outside the project's dependencies and cannot be tested here; PyTorch's "
        "scaled-dot-product attention computes the same exact attention (results equal up to rounding), and its "
        "kernels are somewhat slower than FlashAttention-2 on H100 and A100, so both arms' steps take a little "
        "longer than the authors'. Set model.attn_implementation: flash_attention_2 where flash-attn is installed",
        shows=("attn_implementation: flash_attention_2",),
    ),
    Row(
        GPU8,
        "model.gradient_checkpointing",
        True,
        R1_RECIPE + "L19-21",
        shows=("gradient_checkpointing: true", "use_reentrant: false"),
    ),
    Row(
        GPU8,
        "lora.enabled",
        False,
        R1_RECIPE + "L1-5 (no peft arguments: full fine-tuning)",
        shows=("model_name_or_path: Qwen/Qwen2.5-3B-Instruct", "torch_dtype: bfloat16"),
    ),
    Row(
        GPU8,
        "optim.fsdp",
        "ZeRO-2",
        R1 + "recipes/accelerate_configs/zero2.yaml:L3-9",
        ours=True,
        why="PyTorch FSDP2 (pods_bench/sharding.py): float32 master weights, gradients and AdamW state sharded "
        "over the 8 processes and bf16 compute, as ZeRO-2, with gradients reduce-scattered in float32 after every "
        "pass as ZeRO-2 reduces every micro-step (tests/test_fsdp_gradients.py: a process holds 4P/K bytes of "
        "gradient between passes). Beyond memory it differs in: the parameters are sharded between passes too "
        "(ZeRO-3) and re-gathered (all-gathered in bf16) for every forward and backward pass, where ZeRO-2 keeps "
        "the bf16 weights whole: more communication, the same numbers; the reduce is in float32 of each pass's "
        "bf16 gradient; and the output layer's bf16 gradient is summed over the log-prob chunks in bf16 before "
        "that reduce. The sharded update's gradient equals the whole batch's (tests/test_fsdp.py) and, under "
        "bf16, the float32 sum of the processes' bf16 passes (tests/test_fsdp_gradients.py)",
        describe="DeepSpeed ZeRO-2 (optimizer state and gradients sharded, bf16 compute)",
        shows=("zero_stage: 2", "distributed_type: DEEPSPEED"),
        not_offered=True,
    ),
    Row(GPU8, "engine.name", "hf", R1_RECIPE + "L16 use_vllm false", shows=("use_vllm: false",)),
    Row(
        ("h100x8",),
        "engine.max_batch",
        512,
        R1_TRAINER + "L909-917,L986-994 (one generate call for a process's n x gas = 512 rows)",
        shows=("accumulated_local_batch = self._generate_and_score_completions", "unwrapped_model.generate("),
    ),
    Row(
        ("a100x8",),
        "engine.max_batch",
        512,
        R1_TRAINER + "L909-917,L986-994 (one generate call for a process's n x gas = 512 rows)",
        ours=256,
        why="memory: one 512-row call of the 7B model (512 prompt tokens) needs ~47 GiB for its prefill "
        "(an evaluation call's 512 distinct prompts; a training call's rows share their prompt's prefill) beside 14 GiB of gathered bf16 weights, and the plan puts the arm at 81.5 GiB of 80; two calls of 256 "
        "rows halve the KV cache and the prefill (plan 55.7 GiB). The same rows are sampled, in two calls "
        "(HF generate's sampled tokens depend on the batch they are drawn in)",
        shows=("accumulated_local_batch = self._generate_and_score_completions", "unwrapped_model.generate("),
    ),
    # --- 8 GPUs: optimizer and loss
    Row(
        GPU8,
        "optim.lr",
        2e-5,
        R1_RECIPE + "L24 (launched by exp.sh:L10)",
        ours=5e-6,
        why="recipes/Qwen2.5-3B-Instruct/config.yaml (lr 5e-6 constant) reports to wandb like the published CSVs; "
        "config_pods.yaml, which exp.sh launches, reports only to tensorboard, and the runs' own base config "
        "(recipes/PODS/config.yaml in 778b92b:exp.sh:L11) was never published (docs/workflow.md)",
        shows=("learning_rate: 2.0e-05", "BASE_CFG=recipes/Qwen2.5-3B-Instruct/config_pods.yaml"),
    ),
    Row(
        GPU8,
        "optim.schedule",
        "cosine",
        R1_RECIPE + "L31,L55 (warm-up 0.1)",
        ours="constant",
        why="as optim.lr: config.yaml's constant schedule",
        shows=("lr_scheduler_type: cosine", "warmup_ratio: 0.1"),
    ),
    Row(
        GPU8,
        "optim.warmup_steps",
        0,
        R1 + "recipes/Qwen2.5-3B-Instruct/config.yaml:L63 (warm-up commented out in the constant-lr recipe)",
        shows=("# warmup_ratio: 0.03",),
    ),
    Row(GPU8, "optim.weight_decay", 0.0, "transformers TrainingArguments default (no recipe sets it)"),
    Row(GPU8, "optim.betas", (0.9, 0.999), "transformers TrainingArguments default (no recipe sets them)"),
    Row(GPU8, "optim.max_grad_norm", 1.0, "transformers TrainingArguments default (no recipe sets it)"),
    Row(
        GPU8,
        "optim.updates_per_batch",
        1,
        T + "L314-315 num_iterations",
        shows=("num_iterations: int = field(", "default=1,"),
    ),
    Row(GPU8, "loss.beta", 0.0, R1_RECIPE + "L14", shows=("beta: 0.0",)),
    Row(
        GPU8,
        "loss.reference_forward",
        False,
        R1_TRAINER + "L1032-1033 (no reference pass at beta 0)",
        shows=("if self.beta == 0.0:", "ref_per_token_logps = None"),
    ),
    Row(GPU8, "loss.clip_eps", 0.2, T + "L318-319 epsilon", shows=("epsilon: float = field(", "default=0.2,")),
    Row(
        GPU8,
        "loss.aggregation",
        "micro_batch_token",
        T + "L345-346 loss_type bnpo; " + R1_TRAINER + "L1273-1274",
        shows=('default="bnpo"', 'elif self.loss_type == "bnpo":'),
    ),
    Row(
        GPU8,
        "loss.divide_logits_by_temperature",
        True,
        R1_TRAINER + "L840-842",
        shows=("logits = logits / self.temperature",),
    ),
    Row(
        GPU8,
        "selection.scale_advantage_by_std",
        True,
        T + "L336-337 scale_rewards; " + R1_TRAINER + "L1135-1136",
        shows=("scale_rewards: bool = field(", "advantages = advantages / (std_grouped_rewards + 1e-4)"),
    ),
    # --- 8 GPUs: sampling, task, rewards
    Row(
        GPU8,
        "sampling.temperature",
        0.9,
        T + "L233-234; " + GENERATION_CONFIG,
        shows=("default=0.9,", "temperature=self.temperature"),
    ),
    Row(GPU8, "sampling.top_p", 1.0, T + "L237-238", shows=("default=1.0,",)),
    Row(GPU8, "sampling.top_k", 50, T + "L244-245", shows=("default=50,",)),
    Row(GPU8, "sampling.min_p", 0.0, T + "L251-252 (None: off)", shows=("default=None,",)),
    Row(GPU8, "sampling.repetition_penalty", 1.0, T + "L258-259", shows=("default=1.0,",)),
    Row(GPU8, "sampling.max_new_tokens", 1024, R1_RECIPE + "L33", shows=("max_completion_length: 1024",)),
    Row(GPU8, "task.name", "gsm8k", R1_RECIPE + "L8", shows=("dataset_name: openai/gsm8k",)),
    Row(
        GPU8,
        "task.split",
        "train",
        R1 + "src/open_r1/grpo.py:L118",
        shows=("dataset[script_args.dataset_train_split]",),
    ),
    Row(
        GPU8, "task.limit", None, R1 + "src/open_r1/grpo.py:L118 (the whole split)", shows=("train_dataset=dataset[",)
    ),
    Row(
        GPU8,
        "task.prompt_style",
        "instruct",
        R1_RECIPE + "L10-11 (the question as the user turn after a system prompt, chat template)",
        shows=("dataset_prompt_column: question", "system_prompt:"),
    ),
    Row(
        GPU8,
        "task.system_prompt",
        "You are a helpful AI Assistant that provides well-reasoned and detailed responses. You first think about "
        "the reasoning process as an internal monologue and then provide the user with the answer. Respond in the "
        "following format: <think>\n...\n</think>\n<answer>\n...\n</answer>",
        R1_RECIPE + "L11",
        describe="open-r1's system prompt (think in <think>, answer in <answer>)",
        shows=('system_prompt: "You are a helpful AI Assistant that provides well-reasoned',),
    ),
    Row(
        GPU8,
        "task.max_prompt_tokens",
        512,
        R1_RECIPE + "L32 (longer prompts left-truncated, here dropped; no GSM8K prompt is that long)",
        shows=("max_prompt_length: 512",),
    ),
    Row(
        GPU8,
        "reward.recipe",
        "open-r1",
        R1_RECIPE + "L44-51; src/open_r1/rewards.py:L96-168",
        shows=("- accuracy", "- tag_count", "- 1.0", "def accuracy_reward(", "count += 0.25"),
    ),
    Row(
        GPU8,
        "reward.grading",
        "open-r1",
        R1 + "src/open_r1/rewards.py:L96-138 (math-verify, boxed answers first)",
        shows=("gold_parsed = parse(", "boxed_match_priority=0", "reward = float(verify(gold_parsed, answer_parsed))"),
    ),
    # --- 8 GPUs: budget, evaluation, seeds
    Row(
        GPU8,
        "budget.max_train_time_s",
        2400,
        R1_TRAINER + "L1377 stop after 40 min",
        ours=1800,
        why="the paper's figures and speed-ups use the first 30 minutes (scripts/plot-h100s.py:L26)",
        shows=("if end_time - self.start_time > 40*60:",),
    ),
    Row(
        GPU8,
        "budget.max_steps",
        None,
        R1_RECIPE + "L34,L36 (max_steps -1; one epoch: about 58 GA / 233 PODS steps, never reached in 40 min)",
        shows=("max_steps: -1", "num_train_epochs: 1"),
    ),
    Row(
        GPU8,
        "budget.checkpoint_every_s",
        120,
        R1_TRAINER + "L534 eval_interval 2 min",
        shows=("self.eval_interval = 2*60",),
    ),
    Row(
        GPU8,
        "budget.checkpoint_every_steps",
        None,
        R1_TRAINER + "L534 (evaluation by time only)",
        shows=("self.eval_interval = 2*60",),
    ),
    Row(
        GPU8,
        "eval.inline",
        True,
        R1_TRAINER + "L1354-1372 (evaluation time off the clock)",
        shows=("self.my_evaluate(elapsed_time, self.next_eval_time)", "self.start_time += eval_duration"),
    ),
    Row(
        GPU8,
        "eval.benchmarks",
        ["gsm8k"],
        R1_RECIPE + "L8 (the dataset's test split)",
        shows=("dataset_name: openai/gsm8k",),
    ),
    Row(
        GPU8,
        "eval.split",
        "test",
        R1 + "src/open_r1/grpo.py:L119",
        shows=("eval_dataset=dataset[script_args.dataset_test_split]",),
    ),
    Row(
        ("h100x8",),
        "eval.n_problems",
        "2048 completions",
        "187f43b:results/h100s-acc.csv (accuracies are multiples of 1/2048; checked)",
        ours=None,
        why="the whole GSM8K test split (1,319 problems), once",
        describe="one evaluation batch of 8 x 256 = 2,048 GSM8K test completions (H100 logs)",
    ),
    Row(
        ("a100x8",),
        "eval.n_problems",
        None,
        "187f43b:results/a100s-*.csv (all 144 accuracies are multiples of 1/1408); "
        + R1_RECIPE
        + "L39 per_device_eval_batch_size 16",
        describe="the whole GSM8K test split: 1,319 problems, which the distributed sampler pads to 11 batches "
        "of 8 x 16 = 1,408",
        shows=("per_device_eval_batch_size: 16",),
    ),
    Row(
        GPU8,
        "eval.repeats",
        1,
        R1_TRAINER + "L1314-1325 (one pass over the test split)",
        shows=("for step, inputs in enumerate(eval_dataloader):",),
    ),
    Row(
        GPU8,
        "eval.temperature",
        0.9,
        GENERATION_CONFIG + " (the training GenerationConfig)",
        shows=("temperature=self.temperature",),
    ),
    Row(
        GPU8, "eval.top_p", 1.0, GENERATION_CONFIG + "; " + T + "L237-238", shows=("top_p=self.top_p", "default=1.0,")
    ),
    Row(
        GPU8,
        "eval.top_k",
        50,
        R1_TRAINER + "L1314-1325 (the training GenerationConfig)",
        shows=("results = self._prepare_inputs(inputs)",),
    ),
    Row(
        GPU8, "eval.min_p", 0.0, GENERATION_CONFIG + "; " + T + "L251-252", shows=("min_p=self.min_p", "default=None,")
    ),
    Row(
        GPU8,
        "eval.repetition_penalty",
        1.0,
        GENERATION_CONFIG + "; " + T + "L258-259",
        shows=("repetition_penalty=self.repetition_penalty", "default=1.0,"),
    ),
    Row(
        GPU8,
        "eval.max_new_tokens",
        1024,
        GENERATION_CONFIG + " max_new_tokens",
        shows=("max_new_tokens=self.max_completion_length",),
    ),
    Row(
        GPU8,
        "eval.max_prompt_tokens",
        512,
        R1_RECIPE + "L32 (evaluation batches are prepared like training ones)",
        shows=("max_prompt_length: 512",),
    ),
    Row(
        ("h100x8",),
        "experiment:seeds",
        {"grpo_n32_m32": [21, 22, 23, 24, 25], "pods_n128_m32": [12, 21, 22, 23, 25]},
        R1 + "exp.sh:L15-53",
        ours=[21, 22, 23, 24, 25],
        why="one seed list for all arms (the workflow's grid); the seeds only label independent runs",
        shows=(
            "--seed=12 --output_dir=data/GRPO-s12-p8-n128-m32-ga4",
            "--seed=24 --output_dir=data/GRPO-s24-p8-n32-m32-ga16",
        ),
    ),
    Row(
        ("a100x8",),
        "experiment:seeds",
        {"grpo_n32_m32": [11, 14, 22, 23], "pods_n128_m32": [13, 15, 21, 22, 23]},
        "187f43b:scripts/plot-a100s.py:L30-31 run names; results/a100s-acc.csv",
        ours=[21, 22, 23, 24, 25],
        why="as on H100: one seed list for all arms",
        shows=(r"GR7B-s\d+",),
    ),
]

# Rows whose source is no file copied into PODS_BENCH_UPSTREAM_DIR (run names, the published result
# files, library defaults): their values are checked against the configs only.
NOT_IN_THE_COPIED_FILES = {
    "llama_gsm8k:model.name": "named in no file of the authors",
    "llama_gsm8k:task.prompt_date": "in the prompts stored with the Llama results (not copied)",
    "llama_gsm8k:budget.max_train_time_s": "counted from the Llama result files (not copied)",
    "gsm8k_main+math_main+gsm8k_n_scaling+gsm8k_m_scaling+rule_ablation+llama_gsm8k:lora.dropout": "unsloth's code",
    "h100x8+a100x8:optim.weight_decay": "a transformers default",
    "h100x8+a100x8:optim.betas": "a transformers default",
    "h100x8+a100x8:optim.max_grad_norm": "a transformers default",
    "h100x8:eval.n_problems": "a published result file; test_h100_accuracies_are_multiples_of_1_2048 reads it",
}

# Config keys that change no result (where results go, logging, what is stored, how grading is kept
# safe), with the reason; every other key needs a row for every paper setting where it acts.
NOT_RESULT_KNOBS = {
    "experiment": "a label",
    "arm": "a label",
    "output_dir": "where results go",
    "data_dir": "where the datasets are read from",
    "device": "which device: the paper settings name their hardware in config/hardware.yaml",
    "seed": "a run's seed is experiment:seeds (rows above)",
    "sampling.seed": "which random numbers, not their distribution (derived from the run's seed)",
    "eval.seed": "which random numbers, not their distribution (the authors' evaluation was unseeded)",
    "eval.n_examples": "how many example completions are stored",
    "eval.keep_checkpoints": "which evaluated checkpoints stay on disk",
    "reward.timeout_s": "grading safeguards the authors' code lacks: a timeout scores 0 and counts in reward_failures",
    "reward.deadline_s": "a grading safeguard (as reward.timeout_s)",
    "reward.workers": "grading processes: their time is on the clock like the authors' in-process grading",
    "reward.start_method": "how grading processes start",
    "reward.memory_limit_mb": "a grading safeguard (as reward.timeout_s)",
    "reward.max_answer_chars": "a grading safeguard (as reward.timeout_s)",
    "optim.rows_per_pass": "memory only: the same gradient for every value (tests/test_logprobs.py)",
    "optim.logprob_chunk_tokens": "memory only: the same log-probs and gradient for every value "
    "(tests/test_logprobs.py); the smoke update costs the same as with the full logits "
    "(tests/benchmarks/test_bench_logprobs.py)",
}


def inert(key: str, cfg: TrainConfig) -> bool:
    """Whether `key` has no effect in this resolved config (then it needs no row there)."""
    strategy = key.split(".")[1] if key.startswith("allocation.") and key != "allocation.strategy" else None
    if strategy is not None:
        return cfg.allocation.strategy != strategy
    if key.startswith("selection.") and key.count(".") == 2:  # selection.<rule>.<setting>
        return cfg.selection.rule != key.split(".")[1]
    if key.startswith("lora.") and key != "lora.enabled":
        return not cfg.lora.enabled
    if key.startswith("model.tiny.") or key == "model.init_seed":
        return cfg.model.name != "tiny"
    if key == "task.math_gold":
        return cfg.task.name != "math"
    if key == "task.prompt_date":  # only Llama 3.x chat templates print a date
        return "llama" not in cfg.model.name.lower()
    if key == "optim.fsdp":  # shards full fine-tuning; LoRA configs refuse it
        return cfg.lora.enabled
    if key == "optim.shard_optimizer_state":  # FSDP shards the optimizer state itself (the optim.fsdp row)
        return cfg.optim.fsdp
    if key == "engine.max_batch":
        return cfg.engine.name != "hf"
    if key == "engine.options":
        return cfg.engine.name == "hf"  # the HF engine takes no options
    if key == "loss.clip_eps":  # one update per batch: the ratio is exactly 1, clipping never acts
        return cfg.optim.updates_per_batch == 1
    if key.startswith("reward.") and key.split(".", 1)[1] in RECIPE_FIELDS:
        return cfg.reward.recipe != "custom"  # fixed by the recipe (its row); the config refuses other values
    return False


@cache
def resolved_arms(experiment: str) -> dict:
    return resolve_arms(CONFIG_DIR / f"{experiment}.yaml")


@cache
def experiment_config(experiment: str) -> dict:
    return load_experiment(CONFIG_DIR / f"{experiment}.yaml")[0].to_dict()


def value_of(experiment: str, arm: str, key: str):
    if key.startswith("experiment:"):
        return experiment_config(experiment)[key.split(":", 1)[1]]
    value = resolved_arms(experiment)[arm]
    for part in key.split("."):
        value = getattr(value, part)
    if key == "eval.benchmarks":  # the order only orders the records
        return sorted(value)
    return list(value) if isinstance(value, tuple) and key != "optim.betas" else value


def ours_values(row: Row) -> dict[tuple[str, str], Any]:
    return {(e, arm): value_of(e, arm, row.key) for e in row.settings for arm in resolved_arms(e)}


def per_arm(value, arm: str):
    return value[arm] if isinstance(value, dict) and arm in value else value


def leaf_keys(obj=None, prefix: str = "") -> list[str]:
    """Every config key: the dataclasses' fields, and each registered plugin's settings under its
    section (allocation.<strategy>.<field>, selection.<rule>.<field>), which the config keeps as given."""
    obj = TrainConfig() if obj is None else obj
    registry = plugin_registries().get(prefix.removesuffix("."))
    keys = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name == "sections" and registry is not None:
            for plugin, settings in registry.settings().items():
                keys += leaf_keys(settings(), f"{prefix}{plugin}.")
        elif dataclasses.is_dataclass(value):
            keys += leaf_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


# --- the configs run what the rows say --------------------------------------------------------------


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_every_paper_config_runs_the_stated_value(row):
    for (experiment, arm), value in ours_values(row).items():
        official, ours = per_arm(row.official, arm), per_arm(row.ours, arm)
        if row.same_rule_as is not None:
            assert value == row.same_rule_as, (experiment, arm, value)
        elif row.ours == SAME:
            assert value == (tuple(official) if isinstance(value, tuple) else official), (experiment, arm, value)
        else:
            assert value == ours, (experiment, arm, value)
    if row.ours == SAME:
        return
    differing = {repr(o): o for (_, arm), v in ours_values(row).items() if v != (o := per_arm(row.official, arm))}
    assert differing, "a deviation equal to the official value"
    if row.not_offered:  # the deviation is forced: the authors' value is not one the key can take
        for value in differing.values():
            with pytest.raises(PodsBenchError):
                validate(config_from_dict({"budget": {"max_steps": 1}}, [f"{row.key}={value}"]))


def test_the_a100_model_is_the_7b_reading_of_the_run_names():
    from pods_bench.planning.architecture import model_dims

    for cfg in resolved_arms("a100x8").values():
        assert "7B" in cfg.model.name and 7.0e9 <= model_dims(cfg.model).params < 8.0e9, cfg.model.name


def test_h100_accuracies_are_multiples_of_1_2048():
    """The h100x8 eval.n_problems row: every published H100 accuracy is k / 2048."""
    path = DATA / "pods-paper-logs" / "results" / "h100s-acc.csv"
    if not path.exists():
        pytest.fail(f"{path} not found; set PODS_BENCH_DATA_DIR")
    with path.open(newline="") as f:
        values = [
            float(v)
            for r in csv.DictReader(f)
            for k, v in r.items()
            if k.endswith("accuracy_reward/mean") and v not in ("", None)
        ]
    assert len(values) > 100
    denominators = {Fraction(v).limit_denominator(1 << 20).denominator for v in values}
    assert 2048 in denominators and all(2048 % d == 0 for d in denominators), denominators


# --- the sources say what the rows say --------------------------------------------------------------

CITATION = re.compile(
    r"(?:(?P<commit>TRL@[0-9a-f]{7}|[0-9a-f]{7}):)?(?P<path>[A-Za-z0-9_./*-]+\.(?:py|yaml|sh|csv|json)):"
    r"(?P<lines>L\d+(?:-\d+)?(?:,L\d+(?:-\d+)?)*)"
)


@dataclass(frozen=True)
class Citation:
    folder: str  # <repo>@<commit>
    path: str
    lines: tuple[int, ...]


def citations(source: str) -> list[Citation]:
    """The commit:path:Lx citations of a source; a path without commit belongs to the previous one's."""
    found, commit = [], None
    for m in CITATION.finditer(source):
        commit = m["commit"] or commit
        if commit is None:
            raise AssertionError(f"{source!r}: {m['path']} is cited without a commit")
        folder = f"trl@{commit[4:]}" if commit.startswith("TRL@") else f"pods@{commit}"
        lines = []
        for part in m["lines"].split(","):
            first, _, last = part[1:].partition("-")
            lines += range(int(first), int(last or first) + 1)
        found.append(Citation(folder, m["path"], tuple(lines)))
    return found


def resolve(c: Citation) -> Path:
    """The copied file a citation names: its path, or the one file of that commit whose path ends with it."""
    root = UPSTREAM / c.folder
    if not root.is_dir():
        pytest.fail(f"{root} not found: the upstream copies (../shared/upstream) or PODS_BENCH_UPSTREAM_DIR")
    if (root / c.path).is_file():
        return root / c.path
    matches = [p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix().endswith("/" + c.path)]
    assert len(matches) == 1, f"{c.folder}:{c.path} names {len(matches)} copied files"
    return matches[0]


def cited_text(c: Citation) -> list[str]:
    lines = resolve(c).read_text(encoding="utf-8").split("\n")
    assert max(c.lines) <= len(lines), f"{c.folder}/{c.path} has {len(lines)} lines, cited {max(c.lines)}"
    return [lines[i - 1] for i in c.lines]


def copied(c: Citation) -> bool:
    return (UPSTREAM / c.folder).is_dir() and not c.path.startswith("results/")


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_the_cited_lines_show_the_authors_value(row):
    """Each cited line range exists, is not blank, and shows part of the authors' value; together they
    show all of it (`shows`)."""
    cited = [c for c in citations(row.source) if copied(c)]
    if row.id in NOT_IN_THE_COPIED_FILES:
        assert not cited and not row.shows, f"{row.id} cites copied files: remove it from NOT_IN_THE_COPIED_FILES"
        return
    assert cited, f"{row.id}: no citation of a copied file; cite one or list the row in NOT_IN_THE_COPIED_FILES"
    assert row.shows, f"{row.id}: say what the cited lines show (Row.shows)"
    texts = {c: cited_text(c) for c in cited}
    for c, lines in texts.items():
        assert all(line.strip() for line in lines[:1] + lines[-1:]), f"{row.id}: {c} starts or ends on a blank line"
        assert any(s in "\n".join(lines) for s in row.shows), f"{row.id}: {c} shows none of {row.shows}"
    everything = "\n".join("\n".join(lines) for lines in texts.values())
    missing = [s for s in row.shows if s not in everything]
    assert not missing, f"{row.id}: the cited lines do not show {missing}"


NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")  # unsigned: "512-16-16" is 512, 16, 16


PRODUCT = re.compile(r"(\d+\.?\d*)\s*([*/])\s*(\d+\.?\d*)")
# rows whose official number is not written in the cited text but follows from it by a rule
DERIVED_NUMBERS = {
    "gsm8k_main+math_main+gsm8k_n_scaling+gsm8k_m_scaling+rule_ablation+llama_gsm8k:optim.warmup_steps": (
        "warmup_ratio 0.01 is inert under the constant schedule: 0 warm-up steps"
    ),
    "h100x8+a100x8:optim.warmup_steps": "the recipe's warmup_ratio line is commented out: 0 warm-up steps",
}


def official_numbers(official) -> list[float]:
    """The numbers a row's official value holds (a number, a tuple of them, or {arm: number}); []
    for text values."""
    values = (
        official.values() if isinstance(official, dict) else official if isinstance(official, tuple) else [official]
    )
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def shown_numbers(row: Row) -> list[float]:
    """The numbers in the text a row's citation shows, with the products and quotients written there
    (40*60, 1/6); for a key in seconds also in minutes and hours as the authors' files count them."""
    numbers = [float(x) for text in row.shows for x in NUMBER.findall(text)]
    for text in row.shows:
        for a, op, b in PRODUCT.findall(text):
            numbers.append(float(a) * float(b) if op == "*" else float(a) / float(b))
    if row.key.endswith("_s"):
        numbers += [x * unit for x in numbers for unit in (60, 3600)]
    return numbers


@pytest.mark.parametrize(
    "row", [r for r in ROWS if official_numbers(r.official) and shown_numbers(r)], ids=lambda r: r.id
)
def test_the_authors_value_is_the_number_the_cited_text_shows(row):
    """The row's official value is read from the text its citation shows, not typed twice: a value
    changed in the config and its row together (but not in the authors' file) fails here."""
    if row.id in DERIVED_NUMBERS:
        assert not any(math.isclose(v, x) for v in official_numbers(row.official) for x in shown_numbers(row))
        return  # the rule in DERIVED_NUMBERS gives the value; an entry whose number is shown is stale
    shown = shown_numbers(row)
    for value in official_numbers(row.official):
        assert any(math.isclose(value, x, rel_tol=1e-9, abs_tol=1e-12) for x in shown), (
            f"{row.id}: official {value} is not among the numbers the cited text shows {row.shows}"
        )


# --- the authors' value is read from the cited lines -------------------------------------------------
#
# A row's official value must follow from the text of its cited lines, so that a value changed in the
# config and its row together (but not in the authors' files) fails. A number is found among the numbers
# the cited text shows (test above); a word among its words (official_words_shown); every other value is
# read from the cited lines by its row's entry in READINGS: a parse of the setting there, or the value the
# text stands for (`when`: the text must be there), or the value of the row the cited code takes it from.

UNREAD = object()  # what a reading gives where the cited lines do not say what it reads


def when(text: str, value):
    """`value`, where the cited lines contain `text` (the code that stands for it)."""
    return lambda cited: value if text in cited else UNREAD


def setting(name: str, cited: str):
    """The value the cited lines give `name` (YAML `name: v`, a dict entry `"name": v`, or `name=v`), as
    Python: true/false, numbers, quoted text; UNREAD where they do not set it."""
    m = re.search(rf"""(?<![\w.])["']?{re.escape(name)}["']?\s*[:=]\s*([^,\n)#]+)""", cited)
    if m is None:
        return UNREAD
    text = m[1].strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text == "None":
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if NUMBER.fullmatch(text.lstrip("-")):
        return float(text)
    return text.strip("\"'")


def call_argument(call: str, name: str, default):
    """The keyword `name` of the `call(...)` the cited lines show, or the library's `default` where the
    call leaves it out."""

    def read(cited: str):
        if call + "(" not in cited:
            return UNREAD
        args = cited.split(call + "(", 1)[1].split(")", 1)[0]
        value = setting(name, args)
        return default if value is UNREAD else value

    return read


def field_default(name: str, none_means):
    """The default of the dataclass field `name` in the cited lines (TRL's GRPOConfig), `none_means` for None."""

    def read(cited: str):
        m = re.search(rf"{name}: [^=]+= field\(\s*default=([^,]+),", cited)
        if m is None:
            return UNREAD
        value = setting("default", f"default={m[1]}")
        return none_means if value is None else value

    return read


def official_by_arm(key: str, settings: tuple[str, ...]) -> dict[str, Any]:
    """The official value of `key` for every arm of `settings`, from the rows that state it."""
    found = {}
    for row in ROWS:
        if row.key == key:
            for e in set(row.settings) & set(settings):
                found.update({arm: per_arm(row.official, arm) for arm in resolved_arms(e)})
    return found


def as_row(key: str, text: str):
    """The official value of the row of `key` for the same arms, where the cited lines show `text` (the
    code that takes this value from that setting)."""
    return lambda cited, row: official_by_arm(key, row.settings) if text in cited else UNREAD


def run_names(cited: str) -> list[str]:
    return re.findall(r"'(Instruct-[^']+)'", cited)


def from_run_names(experiment: str, key: str):
    """selection.rule, n or m of each arm, from the run names the cited plot.py lines list in the arms' order."""

    def read(cited: str):
        names = run_names(cited)
        arms = list(SINGLE_GPU_ARMS[experiment][1])
        return (
            {arm: run_name_values(name)[key] for arm, name in zip(arms, names)} if len(names) == len(arms) else UNREAD
        )

    return read


def h100_seeds(cited: str) -> dict[str, list[int]]:
    """The seeds of each arm in the launch lines of exp.sh (n = 32: GRPO-GA, n = 128: PODS)."""
    arm_of_n = {"32": "grpo_n32_m32", "128": "pods_n128_m32"}
    seeds: dict[str, list[int]] = {}
    for n, seed in re.findall(r"--pods_full_size=(\d+).*?--seed=(\d+)", cited, flags=re.DOTALL):
        seeds.setdefault(arm_of_n[n], []).append(int(seed))
    return {arm: sorted(s) for arm, s in seeds.items()}


def gpu8_rule(cited: str, row: Row):
    """n = m keeps every rollout ('all'); the published loop where n > m."""
    if "indices[max_mask] = _indices[max_mask]" not in cited:
        return UNREAD
    n, m = official_by_arm("selection.n", row.settings), official_by_arm("selection.m", row.settings)
    return {arm: "all" if n[arm] == m[arm] else "max_variance (published loop)" for arm in n}


def rows_sampled_per_call(cited: str, row: Row):
    """One generate call for the process's n x groups rows."""
    if "unwrapped_model.generate(" not in cited or "accumulated_local_batch" not in cited:
        return UNREAD
    n = official_by_arm("selection.n", row.settings)
    groups = official_by_arm("selection.groups_per_prompt", row.settings)
    return {arm: n[arm] * groups[arm] for arm in n}


def default_instruct_prompt(cited: str):
    """None (pods-bench's default instruct prompt) where the cited SYSTEM_PROMPT_INSTRUCT is that prompt verbatim."""
    from pods_bench.tasks.prompts import SYSTEM_PROMPT_INSTRUCT

    m = re.search(r'SYSTEM_PROMPT_INSTRUCT = \\\n"""(.*?)"""', cited, flags=re.DOTALL)
    return None if m is not None and m[1] == SYSTEM_PROMPT_INSTRUCT else UNREAD


def yaml_system_prompt(cited: str):
    import yaml

    return yaml.safe_load(cited).get("system_prompt", UNREAD)


def engine_of(cited: str):
    use_vllm = setting("use_vllm", cited)
    return UNREAD if use_vllm is UNREAD else "vllm" if use_vllm else "hf"


def checkpoint_steps(cited: str):
    """None where checkpoints are saved by time (save_steps then unused), else save_steps."""
    strategy = setting("save_strategy", cited)
    return None if strategy == "time" else setting("save_steps", cited)


ONE_PASS = ".sum(dim=1) / completion_mask.sum(dim=1)).mean()"  # the loss of all kept rollouts, one pass
VLLM_DEFAULTS = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}  # top_k -1 (off) is 0 here
# {(settings, key): reading}; a reading takes the cited text (and, with two parameters, the row)
READINGS = {
    **{
        ((experiment,), key): from_run_names(experiment, key)
        for experiment in SINGLE_GPU_ARMS
        for key in ("selection.rule", "selection.n", "selection.m")
    },
    **{(L40S, f"sampling.{k}"): call_argument("SamplingParams", k, v) for k, v in VLLM_DEFAULTS.items()},
    **{(L40S, f"eval.{k}"): call_argument("SamplingParams", k, v) for k, v in VLLM_DEFAULTS.items()},
    (L40S, "allocation.strategy"): when("n=self.num_generations_reward", "uniform"),
    (L40S, "selection.filter_uniform_groups"): when("advantages = (rewards - mean_grouped_rewards)", False),
    (L40S, "selection.advantage_over"): when("rewards = rewards[indices]\n", "kept"),
    (L40S, "selection.scope"): when("indices = sorted_indices[:self.num_generations_grad]", "group"),
    (L40S, "model.attn_implementation"): when("FastLanguageModel.from_pretrained(", "Unsloth's kernels"),
    (L40S, "optim.shard_optimizer_state"): when('optim: "adamw_8bit"', False),
    (L40S, "model.gradient_checkpointing"): lambda t: setting("use_gradient_checkpointing", t) in ("unsloth", True),
    (L40S, "lora.enabled"): when("FastLanguageModel.get_peft_model(", True),
    (L40S, "lora.alpha"): as_row("lora.r", '"lora_alpha": cfg.model.lora_rank'),
    (L40S, "optim.micro_batch_size"): as_row("selection.m", ONE_PASS),
    (L40S, "loss.reference_forward"): when("ref_per_token_logps = self._get_per_token_logps(", True),
    (L40S, "loss.aggregation"): when(ONE_PASS, "sequence"),
    (L40S, "loss.divide_logits_by_temperature"): lambda t: "/ self.temperature" in t,
    (L40S, "optim.updates_per_batch"): when("torch.exp(per_token_logps - per_token_logps.detach())", 1),
    (L40S, "selection.scale_advantage_by_std"): lambda t: "/ (std_grouped_rewards + 1e-4)" in t,
    (L40S, "optim.warmup_steps"): when("warmup_ratio: 0.01", 0),  # inert under the constant schedule
    (("math_main",), "task.name"): lambda t: re.search(r"'Instruct-([A-Z0-9]+)-", t)[1].lower(),
    (L40S, "task.limit"): when('get_questions(cfg.rl.dataset, split = "train"', None),
    (L40S, "task.system_prompt"): default_instruct_prompt,
    (("gsm8k_main", "gsm8k_n_scaling", "gsm8k_m_scaling", "rule_ablation"), "reward.recipe"): when(
        "reward_funcs = reward_funcs + [format_reward_func, xmlcount_reward_func]", "pods-gsm8k"
    ),
    (("math_main",), "reward.recipe"): when(
        "reward_funcs = [correctness_reward_func]\n    if cfg.rl.dataset", "pods-math-nf"
    ),
    (("llama_gsm8k",), "reward.recipe"): when("return [0.01 * format_score(r)", "pods-llama"),
    (QWEN_L40S, "reward.grading"): when(
        "extract_xml_answer(text), extract_last_integer(text)", "string-normalising grader"
    ),
    (("llama_gsm8k",), "reward.grading"): when(
        'numbers = re.findall(r"[\\d\\.\\,]+", text)', "string-normalising grader"
    ),
    (("math_main",), "task.math_gold"): when('answer = answer.split("}")[0]', "released"),
    (L40S, "budget.checkpoint_every_steps"): checkpoint_steps,
    (L40S, "eval.n_problems"): when("total_queries = len(prompts)", None),
    (L40S, "eval.inline"): lambda t: "def test_model(" not in t,
    (L40S, "engine.name"): engine_of,
    (GPU8, "engine.name"): engine_of,
    (GPU8, "allocation.strategy"): when("mini_repeat_count=n*gas", "uniform"),
    (GPU8, "selection.rule"): gpu8_rule,
    (GPU8, "selection.filter_uniform_groups"): when("advantages = rewards - mean_grouped_rewards", False),
    (GPU8, "selection.advantage_over"): when("rewards = rewards.gather(1, indices).view(-1)", "kept"),
    (GPU8, "selection.scope"): when("rewards.detach().view(-1, self.pods_full_size)", "group"),
    (GPU8, "optim.micro_batch_size"): as_row(
        "selection.m", "accumulated_local_batch, self.args.gradient_accumulation_steps"
    ),
    (("a100x8",), "model.name"): lambda t: "a {0}B model (run names GR{0}B-*)".format(re.search(r"GR(\d+)B-", t)[1]),
    (GPU8, "model.dtype"): when("mixed_precision: bf16", "float32"),  # bf16 compute on float32 master weights
    (GPU8, "model.gradient_checkpointing"): lambda t: setting("gradient_checkpointing", t),
    (GPU8, "lora.enabled"): lambda t: "peft" in t,  # the model arguments use no adapter
    (GPU8, "optim.fsdp"): lambda t: f"ZeRO-{setting('zero_stage', t)}",
    (("h100x8",), "engine.max_batch"): rows_sampled_per_call,
    (("a100x8",), "engine.max_batch"): rows_sampled_per_call,
    (GPU8, "optim.warmup_steps"): when("# warmup_ratio: 0.03", 0),  # commented out in the constant-lr recipe
    (GPU8, "loss.reference_forward"): when("if self.beta == 0.0:\n                ref_per_token_logps = None", False),
    (GPU8, "loss.aggregation"): lambda t: {"bnpo": "micro_batch_token"}.get(setting("default", t), UNREAD),
    (GPU8, "loss.divide_logits_by_temperature"): lambda t: "/ self.temperature" in t,
    (GPU8, "selection.scale_advantage_by_std"): lambda t: (
        setting("default", t) and "/ (std_grouped_rewards + 1e-4)" in t
    ),
    (GPU8, "sampling.min_p"): field_default("min_p", none_means=0.0),
    (GPU8, "eval.min_p"): field_default("min_p", none_means=0.0),
    (GPU8, "task.limit"): when("train_dataset=dataset[script_args.dataset_train_split]", None),
    (GPU8, "task.prompt_style"): when("system_prompt:", "instruct"),
    (GPU8, "task.system_prompt"): yaml_system_prompt,
    (GPU8, "reward.recipe"): when("- tag_count", "open-r1"),
    (GPU8, "reward.grading"): when("reward = float(verify(gold_parsed, answer_parsed))", "open-r1"),
    (GPU8, "budget.max_steps"): lambda t: None if setting("max_steps", t) == -1 else setting("max_steps", t),
    (GPU8, "budget.checkpoint_every_steps"): when("self.eval_interval = 2*60", None),  # by time only
    (GPU8, "eval.inline"): when("self.my_evaluate(elapsed_time, self.next_eval_time)", True),
    (("a100x8",), "eval.n_problems"): when("per_device_eval_batch_size: 16", None),  # the whole split, padded
    (GPU8, "eval.repeats"): when("for step, inputs in enumerate(eval_dataloader):", 1),  # one pass
    (GPU8, "eval.temperature"): as_row("sampling.temperature", "temperature=self.temperature"),
    (GPU8, "eval.top_k"): as_row("sampling.top_k", "results = self._prepare_inputs(inputs)"),
    (GPU8, "eval.max_new_tokens"): as_row("sampling.max_new_tokens", "max_new_tokens=self.max_completion_length"),
    (("h100x8",), "experiment:seeds"): h100_seeds,
}
# rows whose official value the copied files cannot show, with the reason
NOT_READ = {
    "a100x8:experiment:seeds": "the seeds are in the run names of results/a100s-*.csv (not copied); the cited "
    "plot-a100s.py lines show only their pattern GR7B-s<seed>",
}


def official_atoms(official) -> list:
    """The plain values a row's official value holds (a value, a list or tuple of them, or {arm: ...})."""
    if isinstance(official, dict):
        return [a for v in official.values() for a in official_atoms(v)]
    if isinstance(official, (list, tuple)):
        return [a for v in official for a in official_atoms(v)]
    return [official]


def read_official(row: Row, cited: str):
    reading = READINGS[(row.settings, row.key)]
    return reading(cited, row) if len(inspect.signature(reading).parameters) == 2 else reading(cited)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_the_official_value_follows_from_the_cited_lines(row):
    """Every row's official value is checked against the text of its cited lines in the authors' files:
    read from them (READINGS), or, for plain numbers and words, found there."""
    if row.id in NOT_IN_THE_COPIED_FILES or row.id in NOT_READ:
        return  # no copied file shows it (the reasons are listed)
    cited = "\n".join("\n".join(cited_text(c)) for c in citations(row.source) if copied(c))
    if (row.settings, row.key) in READINGS:
        read = read_official(row, cited)
        for e in row.settings:
            for arm in resolved_arms(e):
                assert per_arm(read, arm) == per_arm(row.official, arm), (
                    f"{row.id} ({e}/{arm}): the cited lines give {per_arm(read, arm)!r}, the row says "
                    f"{per_arm(row.official, arm)!r}"
                )
        return
    atoms = official_atoms(row.official)
    plain = all(isinstance(a, (int, float, str)) and not isinstance(a, bool) for a in atoms)
    assert atoms and plain, f"{row.id}: the official {row.official!r} is no number or word; add its READINGS entry"
    shown = shown_numbers(row)
    for a in atoms:
        if isinstance(a, str):
            assert re.search(rf"(?<![A-Za-z0-9]){re.escape(a)}(?![A-Za-z0-9])", cited), (
                f"{row.id}: the cited lines do not say {a!r}"
            )
        else:
            assert any(math.isclose(a, x, rel_tol=1e-9, abs_tol=1e-12) for x in shown), (
                f"{row.id}: official {a} is not among the numbers the cited text shows {row.shows}"
            )


def test_every_reading_reads_a_row_from_copied_files():
    rows = {(r.settings, r.key): r for r in ROWS}
    assert set(READINGS) <= set(rows), set(READINGS) - set(rows)
    read = {rows[k].id for k in READINGS}
    assert not read & (set(NOT_IN_THE_COPIED_FILES) | set(NOT_READ)), read & (
        set(NOT_IN_THE_COPIED_FILES) | set(NOT_READ)
    )
    assert set(NOT_READ) <= {r.id for r in ROWS}


def test_rows_without_copied_sources_are_the_listed_ones():
    ids = {r.id for r in ROWS}
    assert set(NOT_IN_THE_COPIED_FILES) <= ids
    assert len(ids) == len(ROWS), "two rows for one setting group and key"


# --- no knob without a row -------------------------------------------------------------------------


def test_every_paper_config_is_covered():
    # the smoke and real-model replications, the allocation-strategy benchmarks and the step-time
    # model's arms are not paper settings; hardware.yaml and models.yaml are not experiments
    not_paper = {
        "smoke",
        "smollm2_arith",
        "hardware",
        "models",
        "strategies",
        "strategies_gsm8k",
        "strategies_repeat",
        "cost_model",
        "cost_model_smollm2",
    }
    paper = {p.stem for p in CONFIG_DIR.glob("*.yaml")} - not_paper
    assert paper == set(PAPER)


@pytest.mark.parametrize("experiment", PAPER)
def test_every_knob_that_changes_results_has_a_row(experiment):
    """A config key that changes the loss, sampling, evaluation or the clock has a row for every paper
    setting where it acts; a new key fails here until it gets rows or a NOT_RESULT_KNOBS reason."""
    keys = leaf_keys()
    assert set(NOT_RESULT_KNOBS) <= set(keys), set(NOT_RESULT_KNOBS) - set(keys)
    rows = {r.key for r in ROWS if experiment in r.settings}
    assert "experiment:seeds" in rows
    for arm, cfg in resolved_arms(experiment).items():
        missing = [k for k in keys if k not in NOT_RESULT_KNOBS and k not in rows and not inert(k, cfg)]
        assert not missing, f"{experiment}/{arm}: no row for {missing}"
        recipe = REWARD_RECIPES[cfg.reward.recipe]
        assert all(getattr(cfg.reward, f) == getattr(recipe, f) for f in RECIPE_FIELDS)


def test_8_gpu_arms_sample_and_train_as_the_official_runs():
    """GRPO-GA (n = m = 32, 16 groups) samples and trains 512 rollouts per prompt; PODS (n = 128,
    m = 32, 4 groups) samples 512 and trains 128."""
    for experiment in GPU8:
        arms = resolved_arms(experiment)
        sampled = {a: c.selection.n * c.selection.groups_per_prompt for a, c in arms.items()}
        trained = {a: c.selection.m * c.selection.groups_per_prompt for a, c in arms.items()}
        assert sampled == {"grpo_n32_m32": 512, "pods_n128_m32": 512}
        assert trained == {"grpo_n32_m32": 512, "pods_n128_m32": 128}
        calls = {a: -(-sampled[a] // c.engine.max_batch) for a, c in arms.items()}
        # one generate call, as the authors'; two on a100x8, where one would not fit (its conformance row)
        assert calls == {a: 1 if experiment == "h100x8" else 2 for a in arms}


# --- the table in docs/fidelity.md ----------------------------------------------------------------


def cell(value) -> str:
    return "`" + str(value).replace("|", "\\|").replace("\n", "\\n") + "`"


def ours_cell(row: Row) -> str:
    """pods-bench's value; where it differs between arms or settings, each with where it holds."""
    values = ours_values(row)
    if len({repr(v) for v in values.values()}) == 1:
        return cell(next(iter(values.values())))
    settings = {e: {arm: v for (e2, arm), v in values.items() if e2 == e} for e in row.settings}
    if len({repr(arms) for arms in settings.values()}) == 1:  # the same per arm in every setting
        shown = next(iter(settings.values()))
    else:
        shown = {}
        for e, arms in settings.items():
            if len({repr(v) for v in arms.values()}) == 1:
                shown[e] = next(iter(arms.values()))
            else:
                shown.update({f"{e}/{arm}": v for arm, v in arms.items()})
    return "<br>".join(f"{label}: {cell(v)}" for label, v in shown.items())


def official_cell(row: Row) -> str:
    if row.describe:
        return row.describe
    if isinstance(row.official, dict):
        return "<br>".join(f"{arm}: {cell(v)}" for arm, v in row.official.items())
    return cell(row.official)


def doc_table() -> str:
    lines = ["| setting | knob | official | source | pods-bench | status |", "| --- | --- | --- | --- | --- | --- |"]
    for row in ROWS:
        settings = GROUP_NAMES.get(row.settings, ", ".join(row.settings))
        status = row.status_note or ("same" if row.status == "same" else f"deviation: {row.why}")
        lines.append(
            f"| {settings} | `{row.key}` | {official_cell(row)} | {row.source} | {ours_cell(row)} | {status} |"
        )
    return "\n".join(lines) + "\n"


def test_the_doc_shows_the_table():
    assert doc_table() in DOC.read_text(encoding="utf-8"), (
        "docs/fidelity.md is out of date: paste the output of `.venv/bin/python -m tests.test_fidelity`"
    )


if __name__ == "__main__":
    print(doc_table(), end="")
