# Before training: the trainer settings shared by every arm, and the starting model -- downloaded
# once with the datasets (so that training jobs need no network), or built by `pods-bench pretrain`
# (the warm-started smoke model); with a budget in baseline steps, the calibration that turns it
# into seconds on this machine.


rule train_config:
    output:
        LAYOUT.train_config,
    params:
        settings=TRAIN_SETTINGS,
    log:
        f"{LOG_DIR}/train_config.log",
    localrule: True
    conda:
        ENVIRONMENT
    script:
        "../scripts/train_config.py"


rule warm_start:
    output:
        directory("results/warm_start/{warm_start}"),
    wildcard_constraints:
        warm_start="|".join(map(re.escape, WARM_START_FOLDERS)),
    params:
        options=lambda wildcards: " ".join(
            f"--{key} {value}"
            for key, value in (
                ("steps", WARM_START.steps),
                ("seconds", WARM_START.seconds),
                ("seed", WARM_START_FOLDERS[wildcards.warm_start]),
            )
            if value is not None
        ),
        threads_env=lambda wildcards, threads: torch_threads(threads),
    log:
        "results/warm_start/logs/{warm_start}.log",
    benchmark:
        "results/warm_start/benchmarks/{warm_start}.tsv"
    threads: PRETRAIN_THREADS  # the recipe's torch threads (pods_bench/pretrain.py): more would build another model
    resources:
        mem_mb=4000,
        runtime=60,
    conda:
        ENVIRONMENT
    shell:
        "{params.threads_env}{PODS_BENCH} pretrain --out {output} {params.options} 2>&1 | tee {log}"


def model_name() -> str:
    return TRAIN_SETTINGS.get("model", {}).get("name", "tiny")


def gguf_model() -> str | None:
    """The GGUF file to convert (gguf:<file>, package:<package>/<file>), or None."""
    return None if WARM_START.enabled or not is_gguf(model_name()) else model_name()


def hub_model() -> str | None:
    """The hub model to download, or None (tiny, warm-started, a local folder or a GGUF file)."""
    name = model_name()
    if WARM_START.enabled or name == "tiny" or Path(name).exists() or is_gguf(name):
        return None
    return name


def prepare_commands() -> str:
    """Load one problem of every dataset split (filling the datasets cache), then download the model."""
    cfg = RESOLVED[ARMS[0]]
    data_dir = f" --data-dir {shlex.quote(cfg.data_dir)}" if cfg.data_dir else ""
    splits = [(BENCHMARK, cfg.task.split)] + [(name, cfg.eval.split) for name in EVAL_BENCHMARKS]
    commands = [f"{PODS_BENCH} tasks {name} --split {split} --limit 1{data_dir}" for name, split in splits]
    if hub_model():
        commands.append(f"hf download {shlex.quote(hub_model())}")
    elif gguf_model():  # converted once into its cached folder, before the training jobs read it
        commands.append(f"{PODS_BENCH} model {shlex.quote(gguf_model())}")
    return " && ".join(commands)


rule prepare:
    output:
        touch(LAYOUT.prepare_done),
    params:
        commands=prepare_commands(),
    log:
        f"{LOG_DIR}/prepare.log",
    conda:
        ENVIRONMENT
    shell:
        "({params.commands}) > {log} 2>&1"


def starting_model(seed=None) -> dict:
    """Input of a training job: the warm-started model of run seed `seed` (None: the first seed's),
    or the prepared downloads."""
    if WARM_START.enabled:
        return {"model": experiment_settings.warm_start_dir(EXPERIMENT, seed)}
    return {"prepared": LAYOUT.prepare_done}


rule calibrate:
    input:
        config=LAYOUT.train_config,
        **starting_model(),
    output:
        calibration=LAYOUT.calibration_json,
        config=LAYOUT.calibrated_train_config,
    params:
        # the baseline arm's settings and the first seed, timed where the runs will train
        overrides=jobs.set_flags(
            [*experiment_settings.arm_overrides(EXPERIMENT, EXPERIMENT.analysis.baseline), f"seed={SEEDS[0]}"]
        ) if CALIBRATED else "",
        options=(
            f"--steps {CALIBRATED.steps} --checkpoints {CALIBRATED.checkpoints} --timed-steps {CALIBRATED.timed_steps} "
            f"--side-by-side {calibration_side_by_side()}"
        ) if CALIBRATED else "",
        # each timed run has the threads of one training job
        threads_env=torch_threads(job_resources("train", ARMS[0])["cpus_per_task"], HARDWARE["processes"]),
    log:
        f"{LOG_DIR}/calibrate.log",
    priority: 2  # before everything else that is ready: the training jobs wait for it
    # as the training jobs run: side by side, each with its threads
    threads: job_resources("train", ARMS[0])["cpus_per_task"] * (calibration_side_by_side() if CALIBRATED else 1)
    resources:
        **job_resources("train", ARMS[0]),
    conda:
        ENVIRONMENT
    shell:
        "{params.threads_env}{PODS_BENCH} calibrate --config {input.config} {params.overrides} {params.options} "
        "--out {LAYOUT.calibration} 2>&1 | tee {log}"
