"""Do the conclusions hold on another warm start? The arms compared once per starting model.

An experiment with several warm starts (`warm_start.seeds`, pods_bench/experiment.py) trains run seed
k from warm start seeds[k % len(seeds)]. The strategies benchmark needs this because its verdicts
moved with the warm start: from a 480-step one Pilot-Commit reached 80 % of GRPO's gain 2.2x sooner,
from a 720-step one 1.29x (docs/notebook/strategies.md). Here every arm is compared with the baseline on the
runs of each starting model alone (compare_arms on that subset of seeds, which stay paired by
seed), by the statistic the strategies benchmark reads: the time to 80 % of the baseline's gain,
the gain measured from that start. Each comparison gets a verdict from its 95 % bootstrap interval:

    faster   the interval lies above 1
    slower   it lies below 1, or the arm never gets there within the budget
    unclear  it contains 1

and a conclusion (faster, or slower) holds when it is the verdict on every start; it is contradicted
when the arm is faster on one start and slower on another; otherwise it is unclear on some start
(with a few seeds per start, the usual case for a modest effect), or on every start. robustness.csv has one row per (arm, start) plus
the pooled row (start "all"); robustness.md one line per arm.
"""

from __future__ import annotations

import pandas as pd

from pods_bench.analysis.speedup import compare_arms
from pods_bench.analysis.tidy import Results

GAIN = 0.8  # the statistic: time to this fraction of the baseline's gain
STAT = f"speedup_gain{round(GAIN * 100)}"
POOLED = "all"
ROBUSTNESS_COLUMNS = [
    "arm",
    "start",  # the starting model's folder, or "all" for every run together
    "seeds",  # the run seeds that started from it, space-separated
    "n_seeds",
    "speedup",  # the baseline's time to 80 % of its gain over the arm's (the baseline's row: 1)
    "speedup_bound",  # "<": the arm never got there; ">=": the baseline did not, a lower bound
    "ci_low",
    "ci_high",
    "verdict",  # faster / slower / unclear / baseline
    "holds",  # faster on every start, or slower on every start (the arm's every row)
    "agreement",  # holds / contradicted (faster on one, slower on another) / partly (unclear on some) / unclear
]


def verdict(row: pd.Series) -> str:
    """faster / slower / unclear from a compare_arms row's 80 %-of-gain speedup and its interval."""
    if row["is_baseline"]:
        return "baseline"
    bound, low, high = row[f"{STAT}_bound"], row[f"{STAT}_ci_low"], row[f"{STAT}_ci_high"]
    if bound == "<" or high < 1:  # never there within the budget, or surely later
        return "slower"
    return "faster" if low > 1 else "unclear"


def starts_of(exp: Results) -> dict[str, list[int]]:
    """Starting model -> the run seeds that started from it (every arm's runs of a seed share one)."""
    if exp.starts is None or not len(exp.starts):
        return {}
    seeds = exp.starts.groupby("start")["seed"].apply(lambda s: sorted(set(int(k) for k in s)))
    return {start: seeds[start] for start in sorted(seeds.index, key=lambda s: seeds[s][0])}


def robustness_table(exp: Results, pooled: pd.DataFrame, n_bootstrap: int = 9999, seed: int = 0) -> pd.DataFrame:
    """ROBUSTNESS_COLUMNS; no rows when the runs share one starting model. `pooled` is compare_arms'
    table on all runs (speedups.csv: the summary has it already), whose baseline, benchmark and
    metric each start's comparison repeats on its own seeds."""
    starts = starts_of(exp)
    if len(starts) < 2:
        return pd.DataFrame(columns=ROBUSTNESS_COLUMNS)
    first = pooled.iloc[0]
    blocks = []
    for start, seeds in [*starts.items(), (POOLED, sorted(exp.evals["seed"].unique()))]:
        rows = (
            pooled
            if start == POOLED
            else compare_arms(
                exp.with_seeds(seeds),
                first["baseline"],
                first["benchmark"],
                first["metric"],
                n_bootstrap=n_bootstrap,
                seed=seed,
                gain_fractions=(GAIN,),
                progress=False,
            )
        )
        blocks.append(
            pd.DataFrame(
                {
                    "arm": rows["arm"],
                    "start": start,
                    "seeds": " ".join(str(int(k)) for k in seeds),
                    "n_seeds": rows["n_seeds"],
                    "speedup": rows[STAT],
                    "speedup_bound": rows[f"{STAT}_bound"],
                    "ci_low": rows[f"{STAT}_ci_low"],
                    "ci_high": rows[f"{STAT}_ci_high"],
                    "verdict": rows.apply(verdict, axis=1),
                }
            )
        )
    table = pd.concat(blocks, ignore_index=True)
    per_start = table[table["start"] != POOLED]
    agreements = per_start.groupby("arm")["verdict"].agg(set).map(agreement)
    table["agreement"] = table["arm"].map(agreements)
    table["holds"] = table["agreement"] == "holds"
    return table[ROBUSTNESS_COLUMNS]


def agreement(verdicts: set[str]) -> str:
    """holds / contradicted / partly / unclear, from an arm's verdicts on the starts (the baseline's:
    holds)."""
    if verdicts == {"unclear"}:
        return "unclear"
    if len(verdicts) == 1:
        return "holds"
    return "contradicted" if {"faster", "slower"} <= verdicts else "partly"


# the last column of robustness.md for an arm whose verdicts disagree or say nothing
OUTCOMES = {
    "contradicted": "no: **contradicted**",
    "partly": "no: unclear on some",
    "unclear": "no: unclear on every start",
}


def robustness_markdown(table: pd.DataFrame, baseline: str) -> str:
    """One line per arm: its verdict on each start and on all runs together, and whether it holds."""
    head = f"# Do the conclusions hold on every warm start? (time to 80 % of {baseline}'s gain)\n\n"
    if not len(table):
        return head + "The runs share one starting model: nothing to compare (set `warm_start.seeds`).\n"
    starts = list(dict.fromkeys(table["start"]))
    seeds = table.drop_duplicates("start").set_index("start")["seeds"]
    columns = [f"{s} (seeds {seeds[s]})" if s != POOLED else "all runs" for s in starts]
    lines = [
        head + f"Every arm against {baseline} on the runs of each starting model alone, the gain measured from that "
        "start; 95 % bootstrap intervals over seeds. faster / slower: the interval lies above / below 1 "
        "(slower also when the arm never gets there); unclear: it contains 1. A conclusion holds when its "
        "verdict (faster, or slower) is the same on every start, and is contradicted when it is faster on one and "
        "slower on another.\n",
        "| arm | " + " | ".join(columns) + " | holds on every start |",
        "| --- | " + " | ".join("---" for _ in columns) + " | --- |",
    ]
    for arm, rows in table.groupby("arm", sort=False):
        if (rows["verdict"] == "baseline").all():
            continue
        cells = []
        for start in starts:
            r = rows[rows["start"] == start].iloc[0]
            cells.append(_cell(r))
        agree = rows["agreement"].iloc[0]
        outcome = f"**yes**: {rows['verdict'].iloc[0]}" if agree == "holds" else OUTCOMES[agree]
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {outcome} |")
    return "\n".join(lines) + "\n"


def _cell(r: pd.Series) -> str:
    if pd.isna(r["speedup"]) or r["speedup_bound"] == "n/a":
        return f"{r['verdict']} (n/a)"
    mark = {"<": "<", ">=": ">="}.get(r["speedup_bound"], "")
    interval = "" if pd.isna(r["ci_low"]) else f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
    return f"{r['verdict']}: {mark}{r['speedup']:.2f}x{interval}"
