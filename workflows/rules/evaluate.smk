# One evaluation job per run (unless the trainer evaluates inline, `train.eval.inline: true`): every
# checkpoint of the run on every evaluation benchmark. Runs are evaluated in parallel as far as the
# scheduler's resources allow, and each as soon as its training has finished.


rule evaluate:
    input:
        LAYOUT.train_done("{arm}", "{seed}"),
    output:
        touch(LAYOUT.eval_done("{arm}", "{seed}")),
    params:
        run_dir=lambda wildcards: run_dir(wildcards.arm, wildcards.seed),
        threads_env=lambda wildcards, threads: torch_threads(threads),
    log:
        LAYOUT.log("evaluate", "{arm}", "{seed}"),
    benchmark:
        LAYOUT.benchmark("evaluate", "{arm}", "{seed}")
    threads: job_resources("evaluate")["cpus_per_task"]
    resources:
        **job_resources("evaluate"),
    conda:
        ENVIRONMENT
    shell:
        "{params.threads_env}{PODS_BENCH} evaluate {params.run_dir} 2>&1 | tee {log}"
