# One training job per (arm, seed): the shared settings plus the arm's and seed's `--set` overrides.
# The job's output is a marker written when training has finished; the run folder itself (logs,
# checkpoints) is the trainer's, so a failed or interrupted job leaves it in place to resume from.
# With `pair_seeds` (the default) a seed's jobs wait for the seed before it, so the arms of one seed
# train side by side; the priority puts ready training jobs before evaluations.


def train_resource(key: str):
    """Resource `key` of an arm's training jobs (the runtime follows the arm's time budget)."""
    return lambda wildcards: job_resources("train", wildcards.arm)[key]


rule train:
    input:
        config=RUN_CONFIG,
        start=lambda wildcards: list(starting_model(int(wildcards.seed)).values()),
        # ancient: an order, not a dependency (a re-evaluated earlier seed does not retrain this one)
        previous_seed=lambda wildcards: [
            ancient(finished_run(arm, seed))
            for arm, seed in jobs.previous_seed_runs(EXPERIMENT, wildcards.seed)
        ],
    output:
        touch(LAYOUT.train_done("{arm}", "{seed}")),
    params:
        launcher=lambda wildcards: train_launcher(wildcards.arm),
        # torch threads of each training process: the job's cores shared by its processes
        threads_env=lambda wildcards, threads: torch_threads(threads, HARDWARE["processes"]),
        overrides=lambda wildcards: jobs.set_flags(run_overrides(wildcards.arm, wildcards.seed)),
    log:
        LAYOUT.log("train", "{arm}", "{seed}"),
    benchmark:
        LAYOUT.benchmark("train", "{arm}", "{seed}")
    priority: 1
    threads: train_resource("cpus_per_task")
    resources:
        **{key: train_resource(key) for key in job_resources("train", ARMS[0])},
    conda:
        ENVIRONMENT
    shell:
        # tee: the trainer's progress bar shows on the console and stays in the log
        "{params.threads_env}{params.launcher} train --config {input.config} {params.overrides} 2>&1 | tee {log}"
