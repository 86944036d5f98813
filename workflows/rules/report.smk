# The run manifest: what was run, with which settings, software and hardware. It goes into the
# HTML report (`snakemake --report`) beside the tables and figures; the report's front page opens
# with the verdict (FRONT_PAGE, the Snakefile's `report:`).


rule manifest:
    input:
        FINISHED_RUNS,
        [LAYOUT.calibration_json] if CALIBRATED else [],
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
        calibration=LAYOUT.calibration_json if CALIBRATED else None,
    log:
        f"{LOG_DIR}/manifest.log",
    localrule: True
    conda:
        ENVIRONMENT
    script:
        "../scripts/manifest.py"


rule front_page:
    input:
        verdict=f"{SUMMARY_DIR}/verdict.md",
        description=str(ROOT / "workflows" / "report" / "workflow.rst"),
    output:
        FRONT_PAGE,
    localrule: True
    shell:
        "(cat {input.verdict}; echo; cat {input.description}) > {output}.tmp && mv {output}.tmp {output}"
