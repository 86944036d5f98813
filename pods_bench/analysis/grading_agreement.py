"""How often the grading modes of `pods_bench.rewards` agree with the authors' verdicts, and with
each other, on the completions stored in the paper's published logs.

Why: the paper's accuracies come from the authors' own string-normalising grader; every pods-bench
mode grades with math-verify. Before a replication's accuracies are set beside the paper's, we need to
know how much the grader alone changes on the same completions, and why.

The single-GPU logs (`Instruct-*.json`, `base-*.json`) store five graded examples per checkpoint and
benchmark: {prompt, answer (the gold), completion, correct (the authors' verdict), format_correct}.
Every example is graded under every mode of `GRADING_MODES`. Mode "open-r1" grades against the full
reference solution as the 8-GPU code did (`gold_texts`): for GSM8K the `answer` column of the test
split, found by the question in the prompt; MATH-500 and AMC23 examples carry only the final answer,
which is that mode's gold there.

Each disagreement of a pair of verdicts gets a category (`categorise`): why the side that rejects the
completion rejects it, judged from the answer's form. The rules were written after reading the
disagreements; docs/grading-agreement.md explains each with an example.

    python -m pods_bench.analysis.grading_agreement [--logs DIR] [--out CSV] [--workers N] [--first-checkpoints K]

prints the agreement and category tables in Markdown and writes one CSV row per disagreement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from pods_bench.errors import PodsBenchError
from pods_bench.io import atomic_write_with
from pods_bench.rewards import (
    _LLAMA_NUMBER,
    GRADING_MODES,
    RewardConfig,
    RewardFunction,
    _Grader,
    answer_block,
    extract_answer,
    gold_texts,
    released_last_number,
)
from pods_bench.tasks import DATA_DIR_ENV, Problem, load_problems, resolve_data_dir

AUTHORS = "authors"  # the column of the authors' verdicts
MODES = tuple(GRADING_MODES)
BENCHMARKS = ("gsm8k", "math500", "amc23")
_USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)  # Qwen's chat template
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def default_logs() -> Path:
    """$PODS_BENCH_DATA_DIR/pods-paper-logs, else ../shared/data/pods-paper-logs."""
    return Path(os.environ.get(DATA_DIR_ENV) or "../shared/data") / "pods-paper-logs"


def load_examples(
    logs: str | Path, files: list[str] | None = None, first_checkpoints: int | None = None
) -> pd.DataFrame:
    """One row per stored example of the single-GPU logs under `logs` (or its results/ folder):
    file, checkpoint ("base" for base-*.json), step, benchmark, example, question, gold, completion,
    authors, format_correct. `files`: only these file names; `first_checkpoints`: only the earliest
    checkpoints of each file."""
    folder = Path(logs)
    folder = folder / "results" if (folder / "results").is_dir() else folder
    paths = sorted(p for p in folder.glob("*.json") if files is None or p.name in files)
    if not paths:
        raise PodsBenchError(f"{folder}: no published single-GPU logs (*.json)")
    rows = []
    for path in paths:
        data = json.loads(path.read_text())
        checkpoints = {"base": data} if set(data) <= set(BENCHMARKS) else data  # base files have no checkpoints
        steps = {name: int(m[1]) if (m := _CHECKPOINT.match(name)) else 0 for name in checkpoints}
        for name in sorted(checkpoints, key=steps.get)[:first_checkpoints]:
            for benchmark, result in checkpoints[name].items():
                for i, e in enumerate(result.get("examples", [])):
                    question = _USER_TURN.search(e["prompt"])
                    rows.append(
                        dict(
                            file=path.name,
                            checkpoint=name,
                            step=steps[name],
                            benchmark=benchmark,
                            example=i,
                            question=question[1].strip() if question else "",
                            gold=e["answer"],
                            completion=e["completion"],
                            authors=bool(e["correct"]),
                            format_correct=bool(e["format_correct"]),
                        )
                    )
    return pd.DataFrame(rows)


def _problems(examples: pd.DataFrame, data_dir: str | Path | None) -> list[Problem]:
    """Each example as a Problem; GSM8K ones with the full solution of the test split (open-r1's gold)."""
    gsm8k = {}
    if (examples["benchmark"] == "gsm8k").any():
        gsm8k = {p.question.strip(): p for p in load_problems("gsm8k", "test", data_dir)}
    problems = []
    for e in examples.itertuples():
        if e.benchmark != "gsm8k":
            problems.append(Problem(f"{e.benchmark}/{e.Index}", e.question, e.gold))
            continue
        p = gsm8k.get(e.question)
        if p is None or p.gold != e.gold:
            raise PodsBenchError(
                f"{e.file} {e.checkpoint}: no GSM8K test question {e.question[:60]!r} with gold {e.gold!r}"
            )
        problems.append(p)
    return problems


def grade_examples(
    examples: pd.DataFrame,
    modes=MODES,
    workers: int = 1,
    data_dir: str | Path | None = None,
    progress: bool = True,
    chunk: int = 50,
) -> pd.DataFrame:
    """`examples` with one boolean column per grading mode, and `open_r1_gold` (that mode's gold text)."""
    problems = _problems(examples, resolve_data_dir(data_dir))
    completions = examples["completion"].tolist()
    graded = examples.assign(open_r1_gold=gold_texts(problems, "open-r1"))
    bar = tqdm(total=len(examples) * len(modes), desc="grading", unit="example", disable=None if progress else True)
    with bar:
        for mode in modes:
            golds, verdicts = gold_texts(problems, mode), []
            with RewardFunction(RewardConfig(grading=mode, workers=workers)) as reward:
                for s in range(0, len(completions), chunk):  # in chunks, for the progress bar
                    verdicts.extend(reward(completions[s : s + chunk], golds[s : s + chunk]).correctness > 0)
                    bar.update(len(completions[s : s + chunk]))
            graded[mode] = verdicts
    return graded


# --- agreement ---------------------------------------------------------------------------------------


def pairs(modes=MODES) -> list[tuple[str, str]]:
    """Each mode vs the authors' verdicts, then each pair of modes."""
    return [(AUTHORS, m) for m in modes] + list(itertools.combinations(modes, 2))


def pair_counts(graded: pd.DataFrame, a: str, b: str) -> dict:
    """The 2x2 table of verdicts a and b, and % agreement."""
    x, y = graded[a], graded[b]
    counts = dict(
        n=len(graded),
        both=int((x & y).sum()),
        only_a=int((x & ~y).sum()),
        only_b=int((~x & y).sum()),
        neither=int((~x & ~y).sum()),
    )
    counts["agree_pct"] = 100.0 * (counts["both"] + counts["neither"]) / counts["n"] if counts["n"] else float("nan")
    return counts


def agreement(graded: pd.DataFrame, modes=MODES) -> pd.DataFrame:
    """One row per (a, b, benchmark); benchmark "all" pools the three."""
    rows = []
    for a, b in pairs(modes):
        for benchmark in (*BENCHMARKS, "all"):
            part = graded if benchmark == "all" else graded[graded["benchmark"] == benchmark]
            rows.append(dict(a=a, b=b, benchmark=benchmark, **pair_counts(part, a, b)))
    return pd.DataFrame(rows)


# --- why they disagree -------------------------------------------------------------------------------

_DELIMITERS = re.compile(r"\\\(|\\\)|\$[^$]*\$")  # \( or \) or a $...$ pair ("$18" alone is a currency sign)
_NUMBER_THEN_WORD = re.compile(r"^\$?\d[\d,.]*\s+[A-Za-z]")  # "18 dollars", "27 miles from City A"

CATEGORIES = {  # name -> why the rejecting side rejects (docs/grading-agreement.md has an example of each)
    "no <answer> block": "no complete <answer>...</answer>, so the rules read different candidates",
    "math delimiters in <answer>": "math-verify reads only the delimited part of `(3, \\(\\frac{\\pi}{2}\\))`",
    "unicode symbol in <answer>": "the string grader cannot read `π` (its sympy check is off)",
    "number then words in <answer>": "math-verify reads `20 cups` as 20*c*u*p*s; only a last integer saves it",
    "Llama rule: last number is punctuation": "the last `[\\d.,]+` match is a full stop or a comma",
    "open-r1: gold parsed wrongly": "a bare MATH-500 answer parses to another value (a pair to 3) or nothing",
    "open-r1: nothing extracted": "no \\boxed{} and no anchored LaTeX answer",
    "open-r1: other LaTeX extracted": "its first LaTeX match is not the answer (`20 \\text{ cups}`)",
    "other": "none of the above",
}


class _OpenR1Reader:
    """What open-r1's rule reads from a completion or a gold, and whether its gold says what the
    plain gold says; math-verify's parser, in this (main) thread."""

    def __init__(self):
        self._grader = _Grader(timeout=1)
        self._gold_ok: dict[tuple[str, str], bool] = {}

    def reads_nothing(self, completion: str) -> bool:
        with self._grader:
            return not self._grader._parse_open_r1(completion, gold=False)

    def gold_ok(self, gold: str, open_r1_gold: str) -> bool:
        from math_verify import verify

        if (gold, open_r1_gold) not in self._gold_ok:
            self._grader.events.timeouts = 0  # `_parse` stops at a timeout counted earlier
            with self._grader:
                parsed = self._grader._parse_open_r1(open_r1_gold, gold=True)
                self._gold_ok[gold, open_r1_gold] = bool(parsed) and verify(self._grader._parse(gold), parsed)
        return self._gold_ok[gold, open_r1_gold]


def categorise(e: pd.Series, a: str, b: str, open_r1: _OpenR1Reader) -> str:
    """Why the side of (a, b) that rejects example `e` rejects it (see CATEGORIES)."""
    rejecting = b if e[a] else a
    if rejecting == "open-r1":
        if not open_r1.gold_ok(e["gold"], e["open_r1_gold"]):
            return "open-r1: gold parsed wrongly"
        if open_r1.reads_nothing(e["completion"]):
            return "open-r1: nothing extracted"
        return "open-r1: other LaTeX extracted"
    if rejecting == "released-1gpu-llama":
        if not re.search(r"\d", released_last_number(e["completion"], _LLAMA_NUMBER)):
            return "Llama rule: last number is punctuation"
    block = answer_block(e["completion"])
    if block is None:
        return "no <answer> block"
    if _DELIMITERS.search(block):
        return "math delimiters in <answer>"
    if any(ord(c) > 127 for c in block):
        return "unicode symbol in <answer>"
    if _NUMBER_THEN_WORD.match(block):
        return "number then words in <answer>"
    return "other"


def disagreements(graded: pd.DataFrame, modes=MODES) -> pd.DataFrame:
    """One row per (example, pair of verdicts) that disagree: which side accepted it, the category,
    pods-bench's extracted answer and the completion."""
    open_r1, rows = _OpenR1Reader(), []
    for a, b in pairs(modes):
        for _, e in graded[graded[a] != graded[b]].iterrows():
            rows.append(
                dict(
                    file=e["file"],
                    checkpoint=e["checkpoint"],
                    benchmark=e["benchmark"],
                    example=e["example"],
                    gold=e["gold"],
                    pair=f"{a} vs {b}",
                    accepted_by=a if e[a] else b,
                    category=categorise(e, a, b, open_r1),
                    pods_bench_answer=extract_answer(e["completion"]),
                    completion=e["completion"],
                )
            )
    return pd.DataFrame(
        rows,
        columns=[
            "file",
            "checkpoint",
            "benchmark",
            "example",
            "gold",
            "pair",
            "accepted_by",
            "category",
            "pods_bench_answer",
            "completion",
        ],
    )


def category_counts(split: pd.DataFrame, modes=MODES) -> pd.DataFrame:
    """Disagreements per category (rows) and pair (columns), as "accepted by the first only / by the
    second only"; empty where there are none."""
    categories = [c for c in CATEGORIES if c in set(split["category"])]
    table = pd.DataFrame("", index=categories, columns=[f"{a} vs {b}" for a, b in pairs(modes)])
    for (pair, category), part in split.groupby(["pair", "category"]):
        first = pair.split(" vs ")[0]
        table.loc[category, pair] = f"{(part['accepted_by'] == first).sum()} / {(part['accepted_by'] != first).sum()}"
    return table


# --- report ------------------------------------------------------------------------------------------


def accuracy(graded: pd.DataFrame, modes=MODES) -> pd.DataFrame:
    """% of examples each verdict accepts, per benchmark and pooled."""
    verdicts = [AUTHORS, *modes]
    per = graded.groupby("benchmark")[verdicts].mean().T[list(BENCHMARKS)]
    return (100 * per.assign(all=graded[verdicts].mean())).round(1)


def report(graded: pd.DataFrame, split: pd.DataFrame) -> str:
    """The Markdown tables: % accepted, % agreement per benchmark (disagreements in brackets), the
    pooled 2x2 counts, and the disagreements by category."""
    table = agreement(graded)
    labels = table["a"] + " vs " + table["b"]
    cells = table.assign(pair=labels, cell=[f"{r.agree_pct:.1f} ({r.only_a + r.only_b})" for r in table.itertuples()])
    wide = cells.pivot(index="pair", columns="benchmark", values="cell").loc[labels.unique(), [*BENCHMARKS, "all"]]
    pooled = cells[cells["benchmark"] == "all"].set_index("pair")[["n", "both", "only_a", "only_b", "neither"]]
    pooled.columns = ["n", "both accept", "only first accepts", "only second accepts", "both reject"]
    return (
        f"% of examples accepted\n\n{accuracy(graded).to_markdown()}\n\n"
        f"% agreement (number of disagreements)\n\n{wide.rename_axis(None).to_markdown()}\n\n"
        f"2x2 counts, all benchmarks\n\n{pooled.rename_axis(None).to_markdown()}\n\n"
        f"Disagreements by category (accepted by the first only / by the second only)\n\n"
        f"{category_counts(split).T.to_markdown()}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pods_bench.analysis.grading_agreement", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--logs", type=Path, default=default_logs(), help="published logs (default: %(default)s)")
    parser.add_argument(
        "--out", type=Path, default=Path("grading-disagreements.csv"), help="CSV, one row per disagreement"
    )
    parser.add_argument(
        "--data-dir", default=None, help=f"datasets for the GSM8K solutions (default: ${DATA_DIR_ENV}, else the hub)"
    )
    parser.add_argument(
        "--first-checkpoints", type=int, default=None, help="only the earliest checkpoints of each file"
    )
    parser.add_argument("--files", nargs="+", default=None, help="only these log files (names, e.g. base-qwen.json)")
    parser.add_argument("--workers", type=int, default=1, help="grading processes")
    args = parser.parse_args(argv)
    examples = load_examples(args.logs, files=args.files, first_checkpoints=args.first_checkpoints)
    graded = grade_examples(examples, workers=args.workers, data_dir=args.data_dir)
    split = disagreements(graded)
    print(f"{len(graded)} examples from {graded['file'].nunique()} files\n")
    print(report(graded, split))
    print("Categories:\n" + "".join(f"- {name}: {why}\n" for name, why in CATEGORIES.items()))
    atomic_write_with(args.out, lambda tmp: split.to_csv(tmp, index=False))
    print(f"wrote {len(split)} disagreements (one row per example and pair of verdicts) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
