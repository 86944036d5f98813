"""docs/results-format.md and the train_log line in code (run_dir.StepRecord) name the same fields,
and a real run writes exactly those: the StepRecord fields, then the allocation strategy's counters
that the page documents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pods_bench.allocation import ALLOCATION_STRATEGIES
from pods_bench.config import config_from_dict
from pods_bench.run_dir import StepRecord
from pods_bench.train import train
from tests.tiny_runs import read_lines, tiny_run

DOC = Path(__file__).resolve().parents[1] / "docs" / "results-format.md"


def documented_train_log_fields() -> tuple[list[str], list[str]]:
    """(fields of the step, the strategies' counters) as the train_log.jsonl section names them: the
    first cell of every table row, the fields named in its 'Fields beyond the contract' paragraph;
    the counters are the allocation table's rows from `num_gen_batches` on, `groups_trained` and the four
    work features excepted (StepRecord fields)."""
    section = DOC.read_text(encoding="utf-8").split("## train_log.jsonl", 1)[1].split("\n## ", 1)[0]
    names = []
    for line in section.splitlines():
        if line.startswith("| `"):
            names += re.findall(r"`([a-z_]+)`", line.split("|")[1])
        elif line.startswith("Fields beyond the contract"):
            paragraph = section[section.index(line) :].split("\n\n", 1)[0]
            names += re.findall(r"`([a-z_]+)`", paragraph)
    step_fields = set(StepRecord.field_names())
    return [n for n in names if n in step_fields], [n for n in names if n not in step_fields]


def test_the_page_documents_every_field_of_the_step_record_and_nothing_else():
    fields, counters = documented_train_log_fields()
    assert sorted(set(fields)) == sorted(StepRecord.field_names())
    assert "num_gen_batches" in counters and "buffer_size" in counters  # the strategies' counters were read
    # the page lists the counters the strategies declare (AllocationStrategy.counters), no more, no less
    declared = {name for strategy in ALLOCATION_STRATEGIES for name in ALLOCATION_STRATEGIES[strategy].counters}
    assert set(counters) == declared


@pytest.mark.parametrize("strategy", list(ALLOCATION_STRATEGIES))
def test_a_run_writes_the_step_record_then_documented_counters(tmp_path, strategy):
    # each strategy trains with the settings its class gives for a one-step tiny run (selection.n = 4)
    example = ALLOCATION_STRATEGIES[strategy].example_settings
    section = {strategy: example} if example else {}
    settings = tiny_run(tmp_path / "run", allocation={"strategy": strategy, **section}, budget={"max_steps": 1})
    train(config_from_dict(settings), progress=False)
    (line,) = read_lines(tmp_path / "run" / "train_log.jsonl")
    fields, counters = documented_train_log_fields()
    keys = list(line)
    assert keys[: len(StepRecord.field_names())] == StepRecord.field_names()
    extra = keys[len(StepRecord.field_names()) :]
    # the strategy's own counters, as its class declares them, and documented
    assert extra and set(extra) <= set(ALLOCATION_STRATEGIES[strategy].counters) <= set(counters), extra
    assert f"`{strategy}`" in allocation_row(), "the `allocation` row names every strategy"


def allocation_row() -> str:
    return next(line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("| `allocation` |"))


def test_the_planner_reads_fields_the_step_record_has():
    """The step-time model's features and the phase times it is fitted on (planning/step_time.py)
    are train_log fields: a renamed field breaks this test, not a profile months later."""
    from pods_bench.planning.step_time import PHASE_FEATURES
    from pods_bench.run_dir import PHASES, phase_field

    fields = set(StepRecord.field_names())
    features = {f for names in PHASE_FEATURES.values() for f in names if f != "1"}
    assert features <= fields and "decode_sequence_steps" in features
    assert {phase_field(p) for p in PHASES} <= fields and set(PHASE_FEATURES) == set(PHASES)
