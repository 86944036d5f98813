"""`make gpu-check` in its CPU mode (tiny shapes), as CI runs it: every part of the GPU check runs
for real and the report holds what it measured, started by the documented offline command
(scripts/gpu-check-offline.sh) as a bare GPU machine would run it: no package index, no venv, and
without the packages such a machine lacks. What only a GPU can show is in tests/test_cuda.py;
here, without one: a row that runs out of memory (the error injected) is recorded and the check
goes on, the report is on disk after every part, a rerun starts fresh smoke runs, rows the plan
says cannot fit are skipped, capacity is the device's, the CUDA tests' exit status and timeout are
honest, and the random model's EOS is never sampled."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import re
import site
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import torch

from pods_bench import gpu_check
from pods_bench.experiment import hardware_setup

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


# --- a bare GPU machine, emulated ----------------------------------------------------------------------

# What a GPU machine with torch, transformers, accelerate, peft, pandas, scipy, matplotlib, seaborn and
# pytest lacks of this venv: the workflow's and the data's packages (which the check must not import),
# and math-verify with what it needs (which travel as wheels: `make gpu-wheels`).
ABSENT = ("snakemake", "datasets", "vllm", "jsonschema", "tabulate", "dill", "pyarrow", "multiprocess", "xxhash")
AS_WHEELS = ("math-verify", "latex2sympy2_extended", "antlr4-python3-runtime")
AS_WHEELS_IMPORTS = ("math_verify", "latex2sympy2_extended", "antlr4")


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def site_without(folder: Path, prefixes: tuple[str, ...]) -> Path:
    """The venv's site-packages as a folder of links, less every package and distribution whose
    name starts with one of `prefixes`: for Python they are not installed at all (no module spec,
    no metadata), not merely unimportable."""
    (source,) = [Path(p) for p in site.getsitepackages() if Path(p).name == "site-packages"][:1]
    folder.mkdir()
    for entry in source.iterdir():
        if not normalised(entry.name).startswith(prefixes):
            (folder / entry.name).symlink_to(entry)
    return folder


SITECUSTOMIZE = """
import sys
# this Python's site-packages is the linked copy without the packages a bare GPU machine lacks
sys.path[:] = [{view!r} if p == {real!r} else p for p in sys.path]
"""


def wheel_from_installed(distribution: str, folder: Path) -> Path:
    """A pure-Python wheel of an installed distribution, from its files (RECORD rewritten): the
    wheels `make gpu-wheels` downloads, made without a package index."""
    dist = importlib.metadata.distribution(distribution)
    files = [f for f in dist.files if f.parts[0] != ".." and "__pycache__" not in f.parts]
    info = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    name = normalised(dist.metadata["Name"])
    path = folder / f"{name}-{dist.version}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(path, "w") as wheel:
        for f in files:
            if f.parts[0] == info and f.name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            data = Path(f.locate()).read_bytes()
            wheel.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{f},sha256={digest},{len(data)}")
        wheel.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return path


def bare_machine(folder: Path) -> tuple[dict, Path]:
    """(environment, wheels folder): `python3` on PATH is this venv's interpreter with the packages
    of ABSENT and AS_WHEELS hidden, no venv active, pip with no index (an unreachable one named
    besides, and no configuration file), Hugging Face offline; the wheels of AS_WHEELS."""
    real = [p for p in site.getsitepackages() if Path(p).name == "site-packages"][0]
    view = site_without(folder / "site-packages", tuple(map(normalised, ABSENT + AS_WHEELS + AS_WHEELS_IMPORTS)))
    custom = folder / "sitecustomize"
    custom.mkdir()
    (custom / "sitecustomize.py").write_text(SITECUSTOMIZE.format(view=str(view), real=real))
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    wheels = folder / "wheels"
    wheels.mkdir()
    for distribution in AS_WHEELS:
        wheel_from_installed(distribution, wheels)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHON"))}
    env |= {
        "PATH": f"{bin_dir}:{env['PATH']}",
        "PYTHONPATH": str(custom),
        "PIP_NO_INDEX": "1",
        "PIP_INDEX_URL": "http://127.0.0.1:9/",
        "PIP_CONFIG_FILE": os.devnull,
        "HF_HUB_OFFLINE": "1",
    }
    return env, wheels


OFFLINE = ROOT / "scripts" / "gpu-check-offline.sh"


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    """One run of the documented offline command, `scripts/gpu-check-offline.sh --device cpu`, on
    the emulated bare machine: its folder, exit status, report and markdown."""
    folder = tmp_path_factory.mktemp("gpu-check")
    env, wheels = bare_machine(tmp_path_factory.mktemp("bare-machine"))
    command = [str(OFFLINE), "--wheels", str(wheels), "--site", str(folder.parent / "gpu-site")]
    out = subprocess.run(
        [*command, "--device", "cpu", "--out", str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=folder.parent,  # not the repository: the script finds it
        env=env,
    )
    report = json.loads((folder / "gpu_check.json").read_text()) if (folder / "gpu_check.json").exists() else None
    return folder, out, report, (folder / "gpu_check.md").read_text() if report else ""


def test_the_emulated_bare_machine_lacks_what_a_gpu_machine_lacks(tmp_path):
    env, _ = bare_machine(tmp_path)
    probe = "import importlib.util as u, sys; print(sys.executable, [n for n in sys.argv[1:] if u.find_spec(n)])"
    names = [*ABSENT, *AS_WHEELS_IMPORTS, "torch", "transformers", "accelerate", "peft", "pytest"]
    out = subprocess.run(["python3", "-c", probe, *names], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split(" ", 1) == [sys.executable, "['torch', 'transformers', 'accelerate', 'peft', 'pytest']\n"]


def test_the_offline_command_names_what_is_missing_and_empties_only_its_own_site_folder(tmp_path):
    (tmp_path / "machine").mkdir()
    env, _ = bare_machine(tmp_path / "machine")
    run = lambda *args: subprocess.run([str(OFFLINE), *args], capture_output=True, text=True, env=env, timeout=120)
    out = run("--wheels", str(tmp_path / "none"), "--site", str(tmp_path / "site"), "--out", str(tmp_path / "out"))
    assert out.returncode == 1 and not (tmp_path / "out").exists()
    assert "lacks math_verify, latex2sympy2_extended, antlr4: prepare the wheels with `make gpu-wheels`" in out.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep").write_text("")
    out = run("--site", str(tmp_path / "mine"), "--out", str(tmp_path / "out"))
    assert out.returncode == 1 and "is not empty and was not made by this script" in out.stderr
    assert (tmp_path / "mine" / "keep").exists()


def test_the_offline_command_installs_only_the_missing_wheels_and_imports_nothing_it_lacks(cpu_check):
    """The wheels of AS_WHEELS went into the site folder and nothing else did; the check never needed
    the workflow's or the data's packages (they are not there to import)."""
    folder, out, report, _ = cpu_check
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    installed = out.stdout.splitlines()[0]
    assert installed.startswith("gpu-check-offline: installing into ") and installed.count(".whl") == 3
    site_folder = folder.parent / "gpu-site"
    assert {normalised(p.name.split("-")[0]) for p in site_folder.glob("*.dist-info")} == set(
        map(normalised, AS_WHEELS)
    )
    assert report["packages"]["math-verify"] == importlib.metadata.version("math-verify")  # from the wheel
    assert report["packages"]["datasets"] is report["packages"]["vllm"] is None


def test_the_gpu_check_runs_in_cpu_mode_and_reports(cpu_check):
    _, out, report, text = cpu_check
    assert out.returncode == 0, out.stderr[-3000:]
    assert report["device"] == "cpu" and report["hardware_setup"] == "cpu" and report["complete"] is True
    assert report["cuda_tests"] == {"ran": False, "passed": None, "why": "no GPU: tests/test_cuda.py skips itself"}
    smoke = {r["arm"]: r for r in report["smoke"]}
    assert set(smoke) == {"grpo_n8_m8", "pods_n8_m2"}
    assert all(r["steps"] == 2 and r["gen_s"] > 0 and r["update_s"] > 0 for r in smoke.values())
    rows = report["paper_scale"]
    assert [(r["mode"], r["n"], r["m"], r["status"]) for r in rows] == [
        ("lora", 4, 4, "measured"),
        ("lora", 8, 4, "measured"),
        ("full", 4, 4, "measured"),
        ("full", 8, 4, "measured"),
    ]
    for r in rows:
        assert r["completion_tokens"] == r["n"] * 16  # the random model decodes to the limit
        assert r["gen_s"] > 0 and r["update_s"] > 0 and r["warmup_gen_s"] > 0 and r["warmup_update_s"] > 0
        assert r["plan_verdict"] == "fits" and r["plan_update_mib"] > r["plan_resting_mib"] > 0 and r["plan_gen_s"] > 0
        # the timed update is the second: AdamW's state (two fp32 moments per trainable parameter)
        # exists by then, as much as the plan counts; the weights are the plan's too
        assert r["optimizer_mib"] == pytest.approx(r["plan_optimizer_mib"], rel=0.01)
        assert r["weights_mib"] == pytest.approx(r["plan_weights_mib"], rel=0.01)
        # the CUDA allocator's counters: none on CPU (tests/test_planning.py measures memory there)
        assert r["resting_mib"] is r["peak_gen_mib"] is r["peak_update_mib"] is None
    assert report["packages"]["torch"] and report["seconds"] > 0
    assert list(report["part_seconds"]) == ["cuda_tests", "smoke", "paper_scale", "sharded", "generate"]
    assert text.startswith("# GPU check:") and "| lora | 8/4 | fits | measured |" in text and "Incomplete" not in text


def test_one_process_of_the_8_gpu_recipe_runs_sharded_in_a_group_of_one(cpu_check):
    """config/h100x8.yaml's process (1 prompt of 8, 512 rows generated, 512 or 128 trained in
    micro-batches of 32) with FSDP2 over gloo at world size 1: one measurement on the arm that
    trains fewest rows, each arm with its plan; the float32 weights and AdamW's state are whole,
    as the plan at world size 1 counts them."""
    _, _, report, text = cpu_check
    rows = {r["arm"]: r for r in report["sharded"]}
    assert list(rows) == ["grpo_n32_m32", "pods_n128_m32"]
    grpo, pods = rows["grpo_n32_m32"], rows["pods_n128_m32"]
    assert (grpo["prompts"], grpo["generated"], grpo["trained"], grpo["micro_batches"]) == (1, 512, 512, 16)
    assert (pods["prompts"], pods["generated"], pods["trained"], pods["micro_batches"]) == (1, 512, 128, 4)
    assert pods["status"] == "measured" and pods["backend"] == "gloo" and pods["world_size"] == 1
    assert pods["completion_tokens"] == 512 * 16  # every row decodes to the (CPU) limit
    assert all(pods[k] > 0 for k in ("gen_s", "update_s", "step_s", "warmup_gen_s", "warmup_update_s"))
    assert "update_from" not in pods and grpo["update_from"].startswith("pods_n128_m32: 16 x")
    assert grpo["update_s"] == pytest.approx(4 * pods["update_s"], rel=0.01)
    for r in (grpo, pods):
        plan = r["plan"]
        assert plan["processes"] == 8 and plan["verdict"] == "fits" and r["plan_update_s"] > 0
        assert all(plan["world_size_1"][phase] > plan["per_device"][phase] for phase in gpu_check.PHASES)
    assert pods["weights_mib"] + pods["optimizer_mib"] == pytest.approx(
        pods["plan"]["world_size_1"]["resting"], rel=0.01
    )
    assert grpo["plan"]["per_device"] == pods["plan"]["per_device"]  # the same micro-batch and generate call
    assert pods["peak_gen_mib"] is pods["peak_step_reserved_mib"] is None  # no CUDA allocator on CPU
    generate = report["generate"]
    assert (
        generate["status"] == "measured"
        and generate["rows"] == 256  # config/a100x8.yaml's engine.max_batch: two calls of 256 a step
        and generate["model"] == "Qwen/Qwen2.5-7B-Instruct"
    )
    assert generate["completion_tokens"] == generate["rows"] * generate["new_tokens"] and generate["plan_gen_mib"] > 0
    assert "| pods_n128_m32 | 128 | 4 | fits, " in text and "## The 7B recipe's generate call" in text


def test_the_documented_plan_of_the_sharded_process_is_the_plans():
    """docs/cost-model.md's table of the plan for part 4 at the recipe's lengths, recomputed."""
    from pods_bench.planning.architecture import known_models
    from pods_bench.planning.memory import Lengths

    hardware, arms = gpu_check.recipe_arms(gpu_check.SHARDED_RECIPE)
    cfg = gpu_check.at_shapes(arms["pods_n128_m32"], "cuda", gpu_check.shapes("cuda")["sharded"])
    plan = gpu_check.sharded_plan(cfg, known_models()[gpu_check.QWEN_3B], hardware, Lengths(512, 1024))
    doc = (ROOT / "docs" / "cost-model.md").read_text(encoding="utf-8")
    table = doc.split("the sharded process at the recipe's lengths, in MiB")[1].split("\n\n")[1].splitlines()[2:]
    documented = [tuple(int(cell) for cell in line.strip("|").split("|")[1:]) for line in table]
    assert documented == [
        (round(plan["world_size_1"][phase]), round(plan["per_device"][phase])) for phase in gpu_check.PHASES
    ]
    need = max(plan["world_size_1"].values()) / 1024 + plan["framework_gib"]
    assert f"plan at world size 1 ({need:.1f} GiB with the framework)" in doc


def test_the_measurement_is_carried_over_to_one_device_of_the_recipe():
    """Less (K-1)/K of the float32 shards the plan counts, and the framework's share added to the
    reserved peak: that is the one-GPU prediction of the 8-GPU fit."""
    plan = {
        "processes": 8,
        "framework_gib": 1.5,
        "capacity_gib": 79.65,
        "per_device": {"resting": 4400.0, "gen": 39000.0, "update": 26000.0, "step": 7300.0},
        "world_size_1": {"resting": 35300.0, "gen": 69900.0, "update": 66900.0, "step": 58400.0},
    }
    measured = {"resting_mib": 35400, "resting_reserved_mib": 36000, "peak_gen_mib": 72000}
    measured |= {"peak_gen_reserved_mib": 75000, "peak_update_mib": 65000, "peak_update_reserved_mib": 70000}
    measured |= {"peak_step_mib": 59000, "peak_step_reserved_mib": 60000}
    carried = gpu_check.predicted_per_device(measured, plan)
    assert carried["gen_allocated_mib"] == 72000 - 30900 and carried["gen_reserved_mib"] == 75000 - 30900
    assert carried["resting_allocated_mib"] == 35400 - 30900 and carried["step_reserved_mib"] == 60000 - 51100
    assert carried["peak_gib"] == pytest.approx(44100 / 1024 + 1.5, abs=0.01) and carried["fits"] is True
    assert gpu_check.predicted_per_device({**measured, "peak_gen_reserved_mib": 150000}, plan)["fits"] is False


def test_an_out_of_memory_row_is_recorded_the_check_goes_on_and_each_part_is_on_disk(cpu_check, monkeypatch):
    """A second check in the first one's folder, with an injected out-of-memory error on one row and
    a crash on the last: the rows in between run, the report on disk grows after every part and
    row, and the smoke runs are new ones, not the first check's finished runs resumed."""
    folder = cpu_check[0]
    first_start = json.loads((folder / "smoke" / "grpo_n8_m8" / "run.json").read_text())["started_at"]
    (folder / "smoke" / "grpo_n8_m8" / "left-by-the-first-check").write_text("")
    measure, on_disk = gpu_check.measure_step, []

    def measure_or_fail(cfg, dims, device, s):
        report = json.loads((folder / "gpu_check.json").read_text())
        on_disk.append((report["cuda_tests"] is not None, len(report["smoke"]), len(report["paper_scale"])))
        row = ("lora" if cfg.lora.enabled else "full", cfg.selection.n)
        if row == ("lora", 8):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.50 GiB. (injected)")
        if row == ("full", 8):
            raise RuntimeError("the check crashed")
        return measure(cfg, dims, device, s)

    monkeypatch.setattr(gpu_check, "measure_step", measure_or_fail)
    with pytest.raises(RuntimeError, match="the check crashed"):
        gpu_check.gpu_check(folder, "cpu")
    assert on_disk == [(True, 2, 0), (True, 2, 1), (True, 2, 2), (True, 2, 3)]
    report = json.loads((folder / "gpu_check.json").read_text())
    assert report["complete"] is False and "seconds" not in report
    assert [(r["mode"], r["n"], r["status"]) for r in report["paper_scale"]] == [
        ("lora", 4, "measured"),
        ("lora", 8, "out of memory"),
        ("full", 4, "measured"),
    ]
    oom = report["paper_scale"][1]
    assert oom["error"] == "CUDA out of memory. Tried to allocate 4.50 GiB. (injected)"
    assert "gen_s" not in oom and oom["plan_update_mib"] > 0  # the plan stays beside it
    text = (folder / "gpu_check.md").read_text()
    assert "**Incomplete**" in text and "| lora | 8/4 | fits | out of memory | - (" in text
    # fresh smoke runs: the first check's folder is gone, and the runs trained their two steps again
    smoke = folder / "smoke" / "grpo_n8_m8"
    assert not (smoke / "left-by-the-first-check").exists()
    assert json.loads((smoke / "run.json").read_text())["started_at"] > first_start
    assert all(r["steps"] == 2 for r in report["smoke"])


def tiny_hardware(memory_gib: float) -> dict:
    cpu = hardware_setup("cpu")
    return {**cpu, "accelerator": {**cpu["accelerator"], "memory_gib": memory_gib}}


def test_rows_the_plan_says_cannot_fit_are_skipped():
    s = gpu_check.shapes("cpu")
    rows = list(gpu_check.paper_scale("cpu", s, tiny_hardware(1 / 1024)))  # 1 MiB: not even the weights
    assert [r["status"] for r in rows] == ["skipped: the plan says it cannot fit"] * 4
    assert all(r["plan_verdict"] == "NO" and "gen_s" not in r for r in rows)
    sharded = list(gpu_check.sharded_part("cpu", s["sharded"], tiny_hardware(1 / 1024)))
    assert [r["status"].split(":")[0] for r in sharded] == ["skipped"] * 2 and all("gen_s" not in r for r in sharded)
    assert "the plan at world size 1 needs" in sharded[0]["status"] and "predicted_per_device" not in sharded[0]
    generate = gpu_check.generate_part("cpu", s["generate"], tiny_hardware(1 / 1024))
    assert generate["status"].startswith("skipped: the plan needs") and "gen_s" not in generate


@pytest.mark.parametrize(
    ("name", "gib", "datasheet", "full_fits"),
    [
        ("NVIDIA H200", 139.8, "h200", True),
        ("NVIDIA A100-SXM4-80GB", 79.3, "a100x8", True),
        ("NVIDIA A100-SXM4-40GB", 39.4, "a100x8", False),
        ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 39.5, "a100x8", False),
        ("NVIDIA L40S", 44.99, "l40s", False),
        ("NVIDIA H100 NVL", 93.1, "h100x8", True),
        ("Tesla V100-SXM2-32GB", 31.7, "h100x8", False),
    ],
)
def test_capacity_is_the_devices_and_the_plan_decides_which_rows_run(name, gib, datasheet, full_fits):
    """The datasheet gives the speeds, the device its memory: at Qwen2.5-3B's size full fine-tuning
    in one process (fp32 weights, gradients and AdamW's moments, ~46 GiB) is skipped on a 40 GB A100,
    a MIG slice or an L40S, and runs on 80 GB and more; LoRA runs everywhere."""
    from pods_bench.planning.architecture import known_models

    label, hardware = gpu_check.hardware_for_gpu(name, int(gib * GIB))
    sheet = hardware_setup(datasheet)["accelerator"]
    assert hardware["processes"] == 1 and hardware["accelerator"]["memory_gib"] == pytest.approx(gib, abs=1e-6)
    assert hardware["accelerator"]["bf16_tflops"] == sheet["bf16_tflops"] and datasheet in label
    assert ("MIG" in label) == ("MIG" in name)
    s, dims = gpu_check.shapes("cuda"), known_models()[gpu_check.QWEN_3B]
    verdict = lambda mode: gpu_check.plan_row(gpu_check.paper_config("cuda", mode, 64, 16, s), dims, hardware, s)
    assert (verdict("full")["plan_verdict"] != "NO") == full_fits
    assert verdict("lora")["plan_verdict"] == "fits"


# --- the CUDA tests' runner --------------------------------------------------------------------------


def cuda_test_file(folder: Path, body: str) -> Path:
    path = folder / "test_cuda_like.py"
    path.write_text("import pytest\n\npytestmark = pytest.mark.cuda\n\n" + textwrap.dedent(body))
    return path


def test_passing_cuda_tests_pass_without_the_test_extras_plugins(tmp_path):
    """pytest-benchmark is not loaded (the project's addopts name its options) and no conftest.py is
    (the project's needs psutil): this one would fail the collection if it were."""
    (tmp_path / "conftest.py").write_text("raise ImportError('conftest.py was loaded')\n")
    test = cuda_test_file(
        tmp_path,
        """
        import sys

        def test_the_test_extras_plugins_are_not_loaded():
            assert "pytest_benchmark" not in sys.modules
        """,
    )
    result = gpu_check.run_pytest([test], tmp_path / "junit.xml")
    assert result["passed"] is True and result["tests"] == 1 and result["returncode"] == 0, result
    assert gpu_check.exit_status({"cuda_tests": result}) == 0
    assert gpu_check.exit_status({"cuda_tests": gpu_check.cuda_tests("cpu", tmp_path)}) == 0  # not run on CPU


def test_a_failing_or_skipped_cuda_test_makes_the_check_exit_1(tmp_path):
    failing = cuda_test_file(tmp_path, "def test_fails():\n    assert 1 == 2\n")
    result = gpu_check.run_pytest([failing], tmp_path / "junit.xml")
    assert result["passed"] is False and result["failures"] == 1 and "assert 1 == 2" in result["output"]
    assert gpu_check.exit_status({"cuda_tests": result}) == 1
    skipped = cuda_test_file(tmp_path, "@pytest.mark.skipif(True, reason='no GPU')\ndef test_x():\n    pass\n")
    result = gpu_check.run_pytest([skipped], tmp_path / "junit.xml")
    assert result["returncode"] == 0 and result["skipped"] == 1 and result["passed"] is False  # checked nothing
    assert gpu_check.exit_status({"cuda_tests": result}) == 1


def test_cuda_tests_that_hang_time_out_with_what_they_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    hanging = cuda_test_file(
        tmp_path,
        f"""
        import subprocess, time

        def test_hangs():
            child = subprocess.Popen(["sleep", "300"])
            open({str(pid_file)!r}, "w").write(str(child.pid))
            time.sleep(300)
        """,
    )
    result = gpu_check.run_pytest([hanging], tmp_path / "junit.xml", timeout_s=10)
    assert result == {"ran": True, "passed": False, "why": "timed out after 10 s", "output": result["output"]}
    assert gpu_check.exit_status({"cuda_tests": result}) == 1
    # the test's own child went with it (its process group); killed, it may wait to be reaped
    assert gone(int(pid_file.read_text()))


def gone(pid: int, within_s: float = 10.0) -> bool:
    """The process ends (or waits, killed, to be reaped) within `within_s` (SIGKILL is asynchronous)."""
    try:
        process = psutil.Process(pid)
        process.wait(within_s)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return process.status() == psutil.STATUS_ZOMBIE
    return True


# --- the random model at a real model's size ---------------------------------------------------------


def test_the_random_models_eos_is_outside_the_sampled_range():
    """With EOS a real id every sampled occurrence would end a row (token 0 was: about 1 check in 5
    at 64 x 512 draws over 151,936 ids, and always here, 64 x 64 draws over 16)."""
    from pods_bench.engines.base import SamplingConfig
    from pods_bench.engines.hf import HFEngine
    from pods_bench.models import TokenIdTokenizer, build_random_model
    from pods_bench.planning.architecture import known_models

    dims = replace(known_models()[gpu_check.QWEN_3B], hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    dims = replace(dims, vocab=16)
    model = build_random_model(dims, "float32", "cpu")
    engine = HFEngine(model, TokenIdTokenizer(dims.vocab))
    assert engine.eos_ids == [dims.vocab] and model.get_output_embeddings().out_features == dims.vocab
    out = engine.generate(["1 2 3"], 64, SamplingConfig(temperature=1.0, max_new_tokens=64, seed=0))
    assert [len(c) for c in out.completion_ids[0]] == [64] * 64
    assert sum(c.count(0) for c in out.completion_ids[0]) > 0  # the padding id is sampled, and stops nothing


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a GPU that is not there")
def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for args, message in [
        (["--out", str(a_file)], f"pods-bench: error: gpu-check --out {a_file}: exists and is not a folder"),
        (
            ["--out", str(tmp_path / "out"), "--device", "cuda"],
            "pods-bench: error: gpu-check --device cuda: no GPU is visible",
        ),
    ]:
        out = subprocess.run(
            [sys.executable, "-m", "pods_bench", "gpu-check", *args], capture_output=True, text=True, cwd=ROOT
        )
        assert (out.returncode, out.stderr.strip()) == (2, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
