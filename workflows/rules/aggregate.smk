# One aggregation per experiment, once every run is trained and evaluated: the speed-up table
# (time for each arm to reach the baseline's peak accuracy, with confidence intervals), the mean
# curves and the seconds per step; then the figures. `paper_figures` does the same for the paper's
# published logs.


rule aggregate:
    input:
        FINISHED_RUNS,
    output:
        report(
            f"{SUMMARY_DIR}/speedups.csv",
            caption="../report/speedups.rst",
            category="Tables",
            labels={"table": "speed-ups (csv)"},
        ),
        report(
            f"{SUMMARY_DIR}/speedups.md",
            caption="../report/speedups.rst",
            category="Tables",
            labels={"table": "speed-ups"},
        ),
        f"{SUMMARY_DIR}/speedups.tex",
        f"{SUMMARY_DIR}/verdict.md",  # the headline, a sentence per arm
        report(
            f"{SUMMARY_DIR}/curves.csv",
            caption="../report/curves.rst",
            category="Tables",
            labels={"table": "accuracy curves"},
        ),
        report(
            f"{SUMMARY_DIR}/step_times.csv",
            caption="../report/step_times.rst",
            category="Tables",
            labels={"table": "seconds per step"},
        ),
        report(
            f"{SUMMARY_DIR}/cost.csv",
            caption="../report/cost.rst",
            category="Tables",
            labels={"table": "rollouts, tokens and FLOPs to the threshold (csv)"},
        ),
        report(
            f"{SUMMARY_DIR}/cost.md",
            caption="../report/cost.rst",
            category="Tables",
            labels={"table": "rollouts, tokens and FLOPs to the threshold"},
        ),
        report(
            f"{SUMMARY_DIR}/waste.csv",
            caption="../report/cost.rst",
            category="Tables",
            labels={"table": "wasted work per step (csv)"},
        ),
        f"{SUMMARY_DIR}/mlperf.csv",
        report(
            f"{SUMMARY_DIR}/mlperf.md",
            caption="../report/mlperf.rst",
            category="Tables",
            labels={"table": "time to a fixed target (MLPerf rules)"},
        ),
        f"{SUMMARY_DIR}/robustness.csv",
        report(
            f"{SUMMARY_DIR}/robustness.md",
            caption="../report/robustness.rst",
            category="Tables",
            labels={"table": "verdicts on each warm start"},
        ),
    params:
        options=jobs.analysis_options(EXPERIMENT.analysis, "aggregate"),
    log:
        f"{LOG_DIR}/aggregate.log",
    conda:
        ENVIRONMENT
    shell:
        # writes results/<experiment>/summary/
        "{PODS_BENCH} aggregate {EXP_DIR} --kind runs --out results {params.options} > {log} 2>&1"


rule plot:
    input:
        rules.aggregate.output,
    output:
        report(
            directory(FIGURES_DIR),
            patterns=["{name}.png"],
            caption="../report/figures.rst",
            category="Figures",
            labels={"figure": "{name}"},
        ),
    params:
        options=jobs.analysis_options(EXPERIMENT.analysis, "plot"),
    log:
        f"{LOG_DIR}/plot.log",
    conda:
        ENVIRONMENT
    shell:
        # writes figures/<experiment>/
        "{PODS_BENCH} plot {EXP_DIR} --kind runs --out figures {params.options} > {log} 2>&1"


rule paper_figures:
    input:
        jobs.paper_logs_dir(EXPERIMENT, ROOT),
    output:
        # one folder per published setting: results/paper/<setting>/summary/, figures/paper/<setting>/
        tables=directory("results/paper"),
        figures=directory("figures/paper"),
    log:
        "results/paper_figures.log",
    conda:
        ENVIRONMENT
    shell:
        "({PODS_BENCH} aggregate {input} --kind paper --out {output.tables} && "
        "{PODS_BENCH} plot {input} --kind paper --out {output.figures}) > {log} 2>&1"
