# The PODS replication workflow.
#
#   snakemake --profile profiles/local                                 # the smoke replication (config/smoke.yaml)
#   snakemake --profile profiles/local --report results/smoke/report.html   # its HTML report
#   snakemake -n --configfile config/<experiment>.yaml                 # dry run: the jobs of an experiment
#   snakemake --profile profiles/slurm --configfile config/gsm8k_main.yaml  # a paper setting on a cluster
#   snakemake --profile profiles/local paper_figures                   # tables + figures of the published logs
#
# An experiment config (config/*.yaml, schema in workflows/schemas/config.schema.yaml) is a grid:
# arms x seeds x training benchmark x evaluation benchmarks x hardware setup. Jobs: one `train` per
# (arm, seed), one `evaluate` per run, then one `aggregate`, `plot` and `manifest` per experiment.
# See docs/workflow.md.

import os

from snakemake.utils import min_version

min_version("9.0")

# The default experiment is the smoke replication; `--configfile` replaces it (not merged into it).
if not workflow.overwrite_configfiles:

    configfile: os.path.join(workflow.basedir, "config", "smoke.yaml")


include: "workflows/rules/common.smk"


# The run grid of the experiment (checked by common.smk): one run per (arm, seed), trained on
# BENCHMARK and evaluated on EVAL_BENCHMARKS. The rule files below make their jobs from it.
ARMS = list(EXPERIMENT.arms)
SEEDS = list(EXPERIMENT.seeds)
BENCHMARK = EXPERIMENT.benchmark
EVAL_BENCHMARKS = list(EXPERIMENT.eval_benchmarks)
# a run is finished once its evaluations are: eval.done, or train.done where the trainer evaluates inline
FINISHED_RUNS = [finished_run(arm, seed) for arm in ARMS for seed in SEEDS]


include: "workflows/rules/prepare.smk"
include: "workflows/rules/train.smk"
include: "workflows/rules/evaluate.smk"
include: "workflows/rules/aggregate.smk"
include: "workflows/rules/report.smk"


# The report's front page: the verdict over the description once the workflow has written it
# (rule front_page), the description alone before.
report: os.path.abspath(FRONT_PAGE) if os.path.exists(FRONT_PAGE) else "workflows/report/workflow.rst"


rule all:
    input:
        FINISHED_RUNS,  # arms x seeds, every run trained and evaluated
        rules.aggregate.output,  # then the experiment's tables, figures and manifest
        rules.plot.output,
        rules.manifest.output,
        FRONT_PAGE,  # the verdict on the HTML report's front page
    default_target: True
    localrule: True


onstart:
    check_cluster_submission()


onsuccess:
    targets = set(workflow.dag_settings.targets) if workflow.dag_settings else set()
    if "paper_figures" in targets:
        print("pods-bench: published logs analysed: tables in results/paper/<setting>/summary/, "
              "figures in figures/paper/<setting>/")
    if not targets or "all" in targets:
        verdict = Path(SUMMARY_DIR) / "verdict.md"  # the headline, a sentence per arm
        headline = [line.strip() for line in verdict.read_text().split("\n\n")] if verdict.exists() else []
        print(
            f"pods-bench: experiment {EXPERIMENT.experiment} is complete.\n"
            + "".join(f"  {line}\n" for line in headline if line)
            + f"  tables:  {SUMMARY_DIR}/ (speedups.md, verdict.md, speedups.csv, curves.csv, step_times.csv)\n"
            f"  figures: {FIGURES_DIR}/\n"
            f"  runs:    {RUNS_DIR}/<arm>/seed<k>/   logs: {LOG_DIR}/\n"
            f"  HTML report: snakemake --configfile {' '.join(CONFIG_FILES)} --report {EXP_DIR}/report.html"
        )


onerror:
    print(f"pods-bench: experiment {EXPERIMENT.experiment} stopped; the failed job's log is named above (logs under {LOG_DIR}/).")
