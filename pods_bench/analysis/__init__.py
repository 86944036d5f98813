"""Analysis of training runs: time-to-peak speedups with bootstrap confidence intervals, summary
tables and figures, for own runs (results/<experiment>/runs/...) and for the paper's published logs.

    load.py        own runs -> the tidy table (tidy.py); picks the loader for a folder
    paper_logs.py  the published logs (single-GPU JSON, multi-GPU CSV exports) -> the tidy table
    speedup.py     the paper's statistic, its noise-robust companions, censoring, bootstrap CIs
    tables.py      summary CSVs, Markdown and LaTeX tables
    figures.py     accuracy / step-time / completion-length figures
    commands.py    the `pods-bench aggregate` and `pods-bench plot` commands
"""
