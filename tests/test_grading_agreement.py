"""Grading agreement on the published completions (pods_bench/analysis/grading_agreement.py).

The first checkpoint of every published single-GPU file (315 examples) is graded under every mode; its
agreement counts and categories must be the ones docs/grading-agreement.md states for that subset, and
the doc must hold the report of that subset word for word, so neither a change of a grader nor an edit
of the doc goes unnoticed. Then one hand-worked completion per mode.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pods_bench.analysis import grading_agreement as ga
from pods_bench.tasks import load_problems

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "grading-agreement.md"

pytestmark = pytest.mark.slow  # ~20 s on an idle 2-core machine

# (a, b) -> (both accept, only a accepts, only b accepts, both reject), first checkpoints, all benchmarks
SUBSET_2X2 = {
    ("authors", "pods-bench"): (166, 19, 3, 127),
    ("authors", "released-1gpu"): (174, 11, 3, 127),
    ("authors", "released-1gpu-llama"): (172, 13, 3, 127),
    ("authors", "open-r1"): (24, 161, 0, 130),
    ("pods-bench", "released-1gpu"): (169, 0, 8, 138),
    ("pods-bench", "released-1gpu-llama"): (167, 2, 8, 138),
    ("pods-bench", "open-r1"): (24, 145, 0, 146),
    ("released-1gpu", "released-1gpu-llama"): (175, 2, 0, 138),
    ("released-1gpu", "open-r1"): (24, 153, 0, 138),
    ("released-1gpu-llama", "open-r1"): (24, 151, 0, 140),
}
# (a, b) -> disagreements on gsm8k, math500, amc23
SUBSET_PER_BENCHMARK = {
    ("authors", "pods-bench"): (6, 15, 1),
    ("authors", "released-1gpu"): (0, 14, 0),
    ("authors", "released-1gpu-llama"): (0, 14, 2),
    ("authors", "open-r1"): (85, 38, 38),
    ("pods-bench", "released-1gpu"): (6, 1, 1),
    ("pods-bench", "released-1gpu-llama"): (6, 1, 3),
    ("pods-bench", "open-r1"): (79, 29, 37),
    ("released-1gpu", "released-1gpu-llama"): (0, 0, 2),
    ("released-1gpu", "open-r1"): (85, 30, 38),
    ("released-1gpu-llama", "open-r1"): (85, 30, 36),
}
# (pair, category) -> (accepted by the first only, by the second only), for the pairs with the authors
SUBSET_CATEGORIES = {
    ("authors vs pods-bench", "math delimiters in <answer>"): (12, 0),
    ("authors vs pods-bench", "unicode symbol in <answer>"): (0, 3),
    ("authors vs pods-bench", "number then words in <answer>"): (7, 0),
    ("authors vs released-1gpu", "math delimiters in <answer>"): (11, 0),
    ("authors vs released-1gpu", "unicode symbol in <answer>"): (0, 3),
    ("authors vs released-1gpu-llama", "math delimiters in <answer>"): (11, 0),
    ("authors vs released-1gpu-llama", "unicode symbol in <answer>"): (0, 3),
    ("authors vs released-1gpu-llama", "Llama rule: last number is punctuation"): (2, 0),
    ("authors vs open-r1", "open-r1: gold parsed wrongly"): (18, 0),
    ("authors vs open-r1", "open-r1: nothing extracted"): (142, 0),
    ("authors vs open-r1", "open-r1: other LaTeX extracted"): (1, 0),
}


@pytest.fixture(scope="module")
def subset(data_dir):
    examples = ga.load_examples(data_dir / "pods-paper-logs", first_checkpoints=1)
    graded = ga.grade_examples(examples, workers=1, data_dir=data_dir, progress=False)
    return graded, ga.disagreements(graded)


def test_subset_is_the_first_checkpoint_of_each_file(subset):
    graded, _ = subset
    assert len(graded) == 315 and graded["file"].nunique() == 21
    assert graded.groupby("file")["checkpoint"].nunique().eq(1).all()
    assert graded["benchmark"].value_counts().to_dict() == {"gsm8k": 105, "math500": 105, "amc23": 105}


def test_subset_agreement_is_as_documented(subset):
    graded, split = subset
    table = ga.agreement(graded)
    pooled = table[table["benchmark"] == "all"]
    assert {(r.a, r.b): (r.both, r.only_a, r.only_b, r.neither) for r in pooled.itertuples()} == SUBSET_2X2
    per = table[table["benchmark"] != "all"].assign(disagree=lambda t: t["only_a"] + t["only_b"])
    assert {
        (a, b): tuple(part.set_index("benchmark").loc[list(ga.BENCHMARKS), "disagree"])
        for (a, b), part in per.groupby(["a", "b"], sort=False)
    } == SUBSET_PER_BENCHMARK
    with_authors = split[split["pair"].str.startswith("authors vs")]
    counts = {
        key: ((part["accepted_by"] == "authors").sum(), (part["accepted_by"] != "authors").sum())
        for key, part in with_authors.groupby(["pair", "category"])
    }
    assert counts == SUBSET_CATEGORIES


def test_the_doc_shows_the_subset_report_verbatim(subset):
    graded, split = subset
    assert ga.report(graded, split) in DOC.read_text(encoding="utf-8")


def test_main_grades_with_the_real_grader_and_writes_the_disagreements(subset, data_dir, tmp_path, capsys):
    """main() end to end on one log file (the base model's 15 examples), graded afresh: its report and
    CSV equal what the subset's grading gives for that file."""
    graded, _ = subset
    out, name = tmp_path / "disagreements.csv", "base-qwen.json"
    logs = str(data_dir / "pods-paper-logs")
    assert ga.main(["--logs", logs, "--files", name, "--out", str(out), "--data-dir", str(data_dir)]) == 0
    mine = graded[graded["file"] == name].reset_index(drop=True)
    expected = ga.disagreements(mine)
    printed = capsys.readouterr().out
    assert printed.startswith("15 examples from 1 files") and ga.report(mine, expected) in printed
    written = pd.read_csv(out, keep_default_na=False)
    assert len(written) == len(expected) > 0
    assert written[["benchmark", "example", "pair", "accepted_by", "category"]].values.tolist() == (
        expected[["benchmark", "example", "pair", "accepted_by", "category"]].values.tolist()
    )


# --- verdicts by reading the completions ---------------------------------------------------------

HAND = ROOT / "docs" / "grading-agreement-hand-graded.csv"
KEY = ["file", "checkpoint", "benchmark", "example"]
VERDICTS = (ga.AUTHORS, "pods-bench", "released-1gpu", "released-1gpu-llama")


@pytest.fixture(scope="module")
def hand_graded(subset, data_dir):
    """The hand-graded examples with every grader's verdict beside the reading: the subset's from its
    grading, the others (later checkpoints) graded here."""
    hand = pd.read_csv(HAND, keep_default_na=False, dtype={"example": int})
    graded, _ = subset
    in_subset = hand.merge(graded[KEY + list(VERDICTS)], on=KEY)
    rest = hand.merge(in_subset[KEY], on=KEY, how="left", indicator=True).query("_merge == 'left_only'")[KEY]
    examples = ga.load_examples(data_dir / "pods-paper-logs", files=sorted(set(rest["file"]))).merge(rest, on=KEY)
    later = ga.grade_examples(examples, modes=VERDICTS[1:], workers=1, data_dir=data_dir, progress=False)
    merged = pd.concat([in_subset, hand.merge(later[KEY + list(VERDICTS)], on=KEY)], ignore_index=True)
    assert len(merged) == len(hand), "a hand-graded example is not in the logs"
    return merged


def hand_table(merged: pd.DataFrame) -> str:
    """Each grader's verdicts against the reading: correct answers accepted / rejected, wrong ones."""
    correct = merged["verdict"] == "correct"
    lines = [
        f"| grader | correct answers accepted (of {int(correct.sum())}) | wrong answers rejected "
        f"(of {int((~correct).sum())}) | agrees with the reading |",
        "| --- | --- | --- | --- |",
    ]
    for mode in VERDICTS:
        accepted = merged[mode].astype(bool)
        agree = int((accepted == correct).sum())
        lines.append(
            f"| {'the authors' if mode == ga.AUTHORS else f'`{mode}`'} | {int((accepted & correct).sum())} | "
            f"{int((~accepted & ~correct).sum())} | {agree} of {len(merged)} |"
        )
    return "\n".join(lines) + "\n"


def test_the_hand_sample_holds_every_disagreement_of_the_subset(subset, hand_graded):
    """Not a chosen few: every first-checkpoint example on which the authors' and the three math-verify
    single-GPU modes do not all agree, plus 10 controls on which they agree, plus the full set's
    disagreements of the category "no <answer> block" (each a disagreement between the authors and
    pods-bench, checked here on fresh grading)."""
    graded, _ = subset
    split = graded[list(VERDICTS)].astype(bool).nunique(axis=1) > 1
    expected = sorted(map(tuple, graded.loc[split, KEY].values.tolist()))
    sample = hand_graded.groupby("sample")
    assert sorted(map(tuple, sample.get_group("disagreement")[KEY].values.tolist())) == expected
    controls = sample.get_group("control")
    assert len(controls) == 10 and (controls[list(VERDICTS)].astype(bool).nunique(axis=1) == 1).all()
    no_block = sample.get_group("no <answer> block")
    assert len(no_block) == 9 and (no_block[ga.AUTHORS] != no_block["pods-bench"]).all()
    assert set(hand_graded["verdict"]) <= {"correct", "wrong"}


def test_the_doc_shows_the_hand_verdicts(hand_graded):
    assert hand_table(hand_graded) in DOC.read_text(encoding="utf-8")


# --- one hand-worked completion per mode -------------------------------------------------------------


@pytest.fixture(scope="module")
def ducks(data_dir):
    """GSM8K test question 0 (gold 18); open-r1 grades against its full solution, which ends "#### 18"."""
    return load_problems("gsm8k", "test", data_dir)[0]


def hand_example(ducks, i, completion, benchmark="gsm8k", gold="18", question=None):
    return dict(
        file="hand",
        checkpoint="base",
        step=0,
        benchmark=benchmark,
        example=i,
        question=ducks.question if question is None else question,
        gold=gold,
        completion=completion,
        authors=True,
        format_correct=True,
    )


def test_hand_worked_examples(ducks, data_dir):
    examples = pd.DataFrame(
        [
            # pods-bench grades one candidate, the <answer> block; math-verify reads "18 dollars" as
            # 18*a*do*l*l*r*s, not 18. The released rules also try the last integer, 18.
            hand_example(ducks, 0, "<think>\n9 x 2 = 18\n</think>\n<answer>\n18 dollars\n</answer>"),
            # released-1gpu: the last integer of "2.5 hours" is 5, so a wrong 2.5 passes for a gold 5. The
            # Llama rule's last number is "2.5", and pods-bench reads 2.5 from the block: both reject.
            hand_example(
                ducks, 1, "<think>\n5 / 2 = 2.5\n</think>\n<answer>\n2.5 hours\n</answer>", "math500", "5", "q"
            ),
            # open-r1 reads LaTeX only, \boxed{} first and nothing without an anchor: "$18" is a bare
            # number with a currency sign, read by every mode but open-r1 ...
            hand_example(ducks, 2, "<think>\n16 - 3 - 4 = 9 eggs, 9 x 2 = 18.\n</think>\n<answer>\n$18\n</answer>"),
            # ... and a boxed 18 is read by all four (open-r1's gold: the solution's "#### 18").
            hand_example(
                ducks, 3, "<think>\n16 - 3 - 4 = 9 eggs, 9 x 2 = 18.\n</think>\n<answer>\n\\boxed{18}\n</answer>"
            ),
        ]
    )
    graded = ga.grade_examples(examples, workers=0, data_dir=data_dir, progress=False)
    assert graded["open_r1_gold"][0] == ducks.solution and ducks.solution.endswith("#### 18")
    assert graded[list(ga.MODES)].astype(int).values.tolist() == [
        # pods-bench, released-1gpu, released-1gpu-llama, open-r1
        [0, 1, 1, 0],
        [0, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],
    ]
    # The authors' string grader accepts all four (by the last integers 18, 5, 18, 18), so each 0 above
    # is a disagreement with the authors, put in the category of the rejected answer's form. open-r1
    # parses both golds (the GSM8K solution and "5") and reads nothing from the answers without \boxed{}.
    split = ga.disagreements(graded)
    with_authors = split[split["pair"].str.startswith("authors vs")]
    assert sorted(zip(with_authors["example"], with_authors["pair"], with_authors["category"])) == [
        (0, "authors vs open-r1", "open-r1: nothing extracted"),
        (0, "authors vs pods-bench", "number then words in <answer>"),
        (1, "authors vs open-r1", "open-r1: nothing extracted"),
        (1, "authors vs pods-bench", "number then words in <answer>"),
        (1, "authors vs released-1gpu-llama", "number then words in <answer>"),
        (2, "authors vs open-r1", "open-r1: nothing extracted"),
    ]
