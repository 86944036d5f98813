"""The Snakemake workflow: every experiment config dry-runs to the expected jobs, and bad configs stop
it before any job starts with one line naming the key (the cases are in tests/test_bad_input.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = PROJECT_ROOT / "Snakefile"
CONFIG_DIR = PROJECT_ROOT / "config"


# How the tests start Snakemake (the SLURM tests start it through tests/cluster/snakemake_quick_status.py)
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake_command(workdir: Path, args, program: list[str] = SNAKEMAKE) -> list[str]:
    """The command line that runs the project's workflow in `workdir` with `args`."""
    return [*program, "--snakefile", str(SNAKEFILE), "--directory", str(workdir), *args]


def snakemake(
    workdir: Path, *args: str, env: dict | None = None, timeout: int = 300, program: list[str] = SNAKEMAKE
) -> subprocess.CompletedProcess:
    """Run the project's workflow in `workdir` (results/ and figures/ go there)."""
    return subprocess.run(
        snakemake_command(workdir, args, program),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def job_counts(output: str) -> dict[str, int]:
    """The "Job stats" table of a dry run: rule -> number of jobs (and "total")."""
    lines = output.splitlines()
    start = lines.index("Job stats:") + 3  # title, header, rule of dashes
    counts = {}
    for line in lines[start:]:
        if not line.strip():
            break
        rule, count = line.split()
        counts[rule] = int(count)
    return counts


def per_experiment(
    train_runs: int, separate_eval: bool = True, warm_start: int = 0, calibrated: bool = False
) -> dict[str, int]:
    """Jobs of one experiment: shared config + model preparation (+ the calibration of a budget in
    baseline steps), one training (and evaluation) job per run, then aggregate, plot, manifest, the
    report's front page and the `all` target."""
    counts = {"train_config": 1, "train": train_runs, "aggregate": 1, "plot": 1, "manifest": 1, "all": 1}
    counts["front_page"] = 1
    if warm_start:
        counts["warm_start"] = int(warm_start)  # how many warm starts (True: one)
    else:
        counts["prepare"] = 1
    if calibrated:
        counts["calibrate"] = 1
    if separate_eval:
        counts["evaluate"] = train_runs
    counts["total"] = sum(counts.values())
    return counts


# arms x seeds of each config, as the paper ran them (docs/workflow.md)
EXPECTED_JOBS = {
    "smoke": per_experiment(2 * 4, separate_eval=False, warm_start=True, calibrated=True),  # inline
    "gsm8k_main": per_experiment(2 * 10),
    "math_main": per_experiment(2 * 10),
    "llama_gsm8k": per_experiment(2 * 10),
    "gsm8k_n_scaling": per_experiment(5 * 10),
    "gsm8k_m_scaling": per_experiment(4 * 10),
    "rule_ablation": per_experiment(3 * 10),
    "h100x8": per_experiment(2 * 5, separate_eval=False),  # evaluated inline every 2 minutes
    "a100x8": per_experiment(2 * 5, separate_eval=False),
    # allocation strategies (docs/allocation.md): 12 arms on CPU from two warm starts, 8 at the paper's scale
    "strategies": per_experiment(12 * 8, separate_eval=False, warm_start=2, calibrated=True),
    "strategies_gsm8k": per_experiment(8 * 5),
    "strategies_repeat": per_experiment(7 * 8, warm_start=True),  # the same on 128 prompts
    # the step-time model's validation arms (docs/cost-model.md; run by `pods-bench profile`)
    "cost_model": per_experiment(9 * 1, warm_start=True),
    "cost_model_smollm2": per_experiment(7 * 1),  # the same on SmolLM2-135M-Instruct
    # the real-model replication on CPU (docs/real-model.md): SmolLM2-135M-Instruct from its package
    "smollm2_arith": per_experiment(2 * 4, separate_eval=False, calibrated=True),
}


def test_every_experiment_config_is_covered():
    experiments = {p.stem for p in CONFIG_DIR.glob("*.yaml")} - {"hardware", "models"}
    assert experiments == set(EXPECTED_JOBS)


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every experiment config dry-run once, with its shell commands (two at a time), for the tests
    below: config name -> the dry run in its own empty folder. smoke's is the workflow run with no
    config file at all: the default target is the smoke experiment."""

    def dry_run(name):
        workdir = tmp_path_factory.mktemp(f"dry-run-{name}")
        configs = [] if name == "smoke" else ["--configfile", str(CONFIG_DIR / f"{name}.yaml")]
        return name, snakemake(workdir, "-n", "--printshellcmds", *configs)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(dry_run, EXPECTED_JOBS))


def test_dry_runs_show_the_expected_jobs(dry_runs):
    for name, out in dry_runs.items():
        assert out.returncode == 0, f"{name}:\n{out.stdout}\n{out.stderr}"
        assert job_counts(out.stdout) == EXPECTED_JOBS[name], name
        workdir = Path(out.args[out.args.index("--directory") + 1])
        assert not (workdir / "results").exists(), f"{name}: a dry run wrote results"


def test_default_target_is_the_smoke_experiment(dry_runs):
    out = dry_runs["smoke"]  # the workflow run with no config file
    assert out.returncode == 0, out.stderr
    assert job_counts(out.stdout) == EXPECTED_JOBS["smoke"]
    assert "results/smoke/runs/pods_n16_m8/seed3/train.done" in out.stdout


def test_training_jobs_get_the_arm_settings_and_hardware_resources(dry_runs):
    out = dry_runs["h100x8"]
    assert out.returncode == 0, out.stderr
    shell = [line for line in out.stdout.splitlines() if " train --config " in line]
    assert len(shell) == 10
    pods = next(line for line in shell if "arm=pods_n128_m32" in line and "seed=21" in line)
    # multi-GPU training goes through the distributed engine with the setup's process count
    assert "accelerate launch --num_processes 8" in pods and "-m pods_bench train" in pods
    for item in (
        "selection.rule=max_variance",
        "selection.n=128",
        "selection.m=32",
        "selection.groups_per_prompt=4",
        "output_dir=results/h100x8/runs/pods_n128_m32/seed21",
    ):
        assert f"--set {item}" in pods
    # resources from config/hardware.yaml (h100x8): 8 H100s, runtime = 30 min budget x 1.5 + 60
    assert "gpu=8" in out.stdout and "gpu_model=h100" in out.stdout and "runtime=105" in out.stdout


def test_each_run_seed_starts_from_its_warm_start(dry_runs):
    # config/strategies.yaml: warm_start.seeds [0, 1], so even run seeds start from the first, odd from the second
    out = dry_runs["strategies"]
    assert out.returncode == 0, out.stderr
    pretrain = sorted(
        line.split(" pretrain ")[1].split(" 2>&1")[0] for line in out.stdout.splitlines() if " pretrain --out " in line
    )
    assert pretrain == [
        "--out results/warm_start/arith-tiny --seed 0",
        "--out results/warm_start/arith-tiny-seed1 --seed 1",
    ]
    train = [line for line in out.stdout.splitlines() if " train --config " in line and "arm=grpo_n16_m16" in line]
    for seed in range(8):
        line = next(line for line in train if f"--set seed={seed} " in line)
        assert f"--set model.name=results/warm_start/arith-tiny{'-seed1' if seed % 2 else ''} " in line + " ", line


# --- bad input -----------------------------------------------------------------------------------


def one_error_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("pods-bench workflow:")]
    assert len(lines) == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    return lines[0]


def test_lists_on_the_command_line_are_caught_as_strings(tmp_path):
    # `--config seeds=[0,1]` reaches the workflow as strings: say so, and where to put lists instead
    out = snakemake(tmp_path, "-n", "--config", "seeds=[0,1]")
    assert out.returncode != 0
    line = one_error_line(out)
    assert "config key seeds[0] must be integer, got the string '0'" in line and "--configfile" in line


def test_scalar_overrides_on_the_command_line_work(tmp_path):
    out = snakemake(tmp_path, "-n", "--config", "hardware=l40s")
    assert out.returncode == 0, out.stderr
    assert job_counts(out.stdout) == EXPECTED_JOBS["smoke"]


def test_paper_figures_from_the_published_logs(tmp_path, data_dir):
    # `paper_logs` is a config key relative to the project root ...
    (tmp_path / "w1").mkdir()
    out = snakemake(tmp_path / "w1", "-n", "paper_figures", "--config", "paper_logs=no/such/folder")
    assert out.returncode != 0 and str(PROJECT_ROOT / "no" / "such" / "folder") in out.stdout + out.stderr
    # ... and PODS_BENCH_PAPER_LOGS overrides it: tables and figures of every published setting
    out = snakemake(
        tmp_path, "--cores", "1", "paper_figures", env={"PODS_BENCH_PAPER_LOGS": str(data_dir / "pods-paper-logs")}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    settings = sorted(p.parent.name for p in (tmp_path / "results" / "paper").glob("*/summary"))
    assert settings, "no published setting analysed"
    for setting in settings:
        assert (tmp_path / "results" / "paper" / setting / "summary" / "speedups.csv").is_file()
        assert list((tmp_path / "figures" / "paper" / setting).glob("*.png"))


def test_a_failed_job_names_its_log(tmp_path):
    # the GSM8K setting reading its data from an empty folder: the first job fails, and says where its log is
    empty = tmp_path / "no-data"
    empty.mkdir()
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump({"train": {"data_dir": str(empty)}}))
    out = snakemake(tmp_path, "--cores", "1", "--configfile", str(CONFIG_DIR / "gsm8k_main.yaml"), str(override))
    assert out.returncode != 0
    log = "results/gsm8k_main/logs/prepare.log"
    assert f"log: {log}" in out.stdout + out.stderr
    assert "pods-bench: error:" in (tmp_path / log).read_text()
    assert not (tmp_path / "results" / "gsm8k_main" / "runs").exists()


def test_profiles(tmp_path):
    # local: usable as is; slurm: every setting but the executor's (its plugin is not a dependency;
    # tests/test_workflow_slurm.py runs the profile as it is on a real SLURM)
    local = snakemake(tmp_path, "-n", "--profile", str(PROJECT_ROOT / "profiles" / "local"))
    assert local.returncode == 0, local.stderr
    slurm = yaml.safe_load((PROJECT_ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert slurm.pop("executor") == "slurm"
    slurm = {key: value for key, value in slurm.items() if not key.startswith("slurm-")}
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "config.yaml").write_text(yaml.safe_dump(slurm))
    out = snakemake(
        tmp_path, "-n", "--profile", str(tmp_path / "slurm"), "--configfile", str(CONFIG_DIR / "gsm8k_main.yaml")
    )
    assert out.returncode == 0, out.stderr
    train = [line for line in out.stdout.splitlines() if "gpu_model=l40s" in line]
    assert len(train) == 40  # 20 training + 20 evaluation jobs, each asking for one L40S
    assert all("gpu=1" in line and "tasks_per_gpu=0" in line for line in train)


def test_the_reference_overlays_ask_only_for_the_baselines_runs_at_their_own_seeds(tmp_path):
    """`make smoke-target` / `make strategies-target`: the experiment under its reference name, GRPO at
    seeds 10-13 (none of the timed runs' seeds), each run waiting on no other."""
    for name in ("smoke", "strategies"):
        runs = [f"results/{name}_reference/runs/grpo_n16_m16/seed{seed}/train.done" for seed in (10, 11, 12, 13)]
        overlay = str(CONFIG_DIR / "targets" / f"{name}_reference.yaml")
        (tmp_path / name).mkdir()
        out = snakemake(tmp_path / name, "-n", *runs, "--configfile", str(CONFIG_DIR / f"{name}.yaml"), overlay)
        assert out.returncode == 0, out.stderr
        assert job_counts(out.stdout)["train"] == 4, name
        assert not set(yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())["seeds"]) & {10, 11, 12, 13}
