# The run manifest: what was run, with which settings, software and hardware. It goes into the
# HTML report (`snakemake --report`) beside the tables and figures.


rule manifest:
    input:
        FINISHED_RUNS,
    output:
        report(
            f"{SUMMARY_DIR}/manifest.yaml",
            caption="../report/manifest.rst",
            category="Manifest",
            labels={"file": "run manifest"},
        ),
    params:
        experiment_config=EXPERIMENT.to_dict(),
        config_files=CONFIG_FILES,
        hardware={"name": EXPERIMENT.hardware, **HARDWARE},
        runs=[run_dir(arm, seed) for arm in ARMS for seed in SEEDS],
    log:
        f"{LOG_DIR}/manifest.log",
    localrule: True
    conda:
        ENVIRONMENT
    script:
        "../scripts/manifest.py"
