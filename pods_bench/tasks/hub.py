"""The paper's benchmarks, read from the Hugging Face hub or from a local copy in the same schema.

    gsm8k    openai/gsm8k (config main)           gold: the text after '####', commas removed
    math     EleutherAI/hendrycks_math, 7 configs  gold: the last \\boxed{...} of the solution
    math500  HuggingFaceH4/MATH-500               gold: the `answer` column
    amc23    zwhe99/amc23                         gold: the `answer` column (27.0 -> "27")

A local copy is a folder holding `<task>/<split>.jsonl` or `<task>/<split>.jsonl.gz` (for `math`,
the seven subjects concatenated in the order above), given as `data_dir` or $PODS_BENCH_DATA_DIR.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pods_bench.errors import PodsBenchError
from pods_bench.rewards.extraction import last_boxed
from pods_bench.tasks.base import Problem, Task, register_task, resolve_data_dir


@dataclass(frozen=True)
class HubTask(Task):
    name: str
    hub_id: str
    configs: tuple[str | None, ...]  # hub configs, concatenated in this order
    splits: tuple[str, ...]
    fields: tuple[str, ...]  # columns every row must have
    to_problem: Callable[[dict, str, int], Problem]  # (row, split, row index) -> Problem

    @property
    def source(self) -> str:
        configs = ", ".join(c for c in self.configs if c)
        return f"{self.hub_id} ({configs})" if configs else self.hub_id

    def load(self, split: str, data_dir: str | Path | None = None) -> list[Problem]:
        self.check_split(split)
        data_dir = resolve_data_dir(data_dir)
        if data_dir is None:
            dataset, where = self._from_hub(split), f"{self.hub_id} split {split!r}"
        else:
            path = self._local_file(data_dir, split)
            dataset, where = self._from_file(path), str(path)
        missing = [f for f in self.fields if f not in dataset.column_names]
        if missing:
            raise PodsBenchError(
                f"{where}: missing field {missing[0]!r} (task {self.name} needs {', '.join(self.fields)})"
            )
        rows = dataset.to_list()
        for i, row in enumerate(rows):
            empty = next((f for f in self.fields if row[f] is None), None)
            if empty is not None:
                raise PodsBenchError(f"{where}: row {i} has no value for field {empty!r}")
        return [self.to_problem(row, split, i) for i, row in enumerate(rows)]

    def _local_file(self, data_dir: Path, split: str) -> Path:
        if not data_dir.is_dir():
            raise PodsBenchError(f"data folder {data_dir} does not exist")
        for suffix in (".jsonl", ".jsonl.gz"):
            path = data_dir / self.name / f"{split}{suffix}"
            if path.is_file():
                return path
        raise PodsBenchError(f"task {self.name}: no file {data_dir / self.name / split}.jsonl[.gz]")

    @staticmethod
    def _from_file(path: Path):
        import datasets

        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                has_rows = any(line.strip() for line in f)
        except (OSError, UnicodeDecodeError) as e:
            raise PodsBenchError(f"{path}: unreadable ({type(e).__name__}: {e})") from e
        if not has_rows:  # datasets raises a bare StopIteration on an empty file
            raise PodsBenchError(f"{path}: empty file (no rows)")
        # no "Generating train split" bar: a local file loads in a moment, and the bar would stand
        # on stderr before any one-line error about the file
        bars_were_on = not datasets.are_progress_bars_disabled()
        datasets.disable_progress_bars()
        try:
            return datasets.load_dataset("json", data_files=str(path), split="train")
        except Exception as e:
            raise PodsBenchError(f"{path}: not valid JSON Lines ({type(e).__name__})") from e
        finally:
            if bars_were_on:
                datasets.enable_progress_bars()

    def _from_hub(self, split: str):
        import datasets

        try:
            parts = [datasets.load_dataset(self.hub_id, config, split=split) for config in self.configs]
        except Exception as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise PodsBenchError(
                f"task {self.name}: cannot load {self.hub_id} split {split!r} from the hub ({reason}); "
                f"for local files pass a data folder or set PODS_BENCH_DATA_DIR"
            ) from e
        return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]


# --- gold answers --------------------------------------------------------------------------------


def gsm8k_gold(answer: str) -> str | None:
    """GSM8K solutions end in `#### 1,000`: the gold is "1000"."""
    _, marker, final = answer.rpartition("####")
    return final.strip().replace(",", "") if marker else None


def number_text(value) -> str:
    """AMC23 stores answers as floats (27.0): integers are written without ".0"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _gold_or_fail(gold: str | None, problem_id: str, what: str) -> str:
    if gold is None:
        raise PodsBenchError(f"{problem_id}: {what}")
    return gold


def _gsm8k(row: dict, split: str, i: int) -> Problem:
    pid = f"gsm8k/{split}/{i}"
    gold = _gold_or_fail(gsm8k_gold(row["answer"]), pid, "answer has no '#### <final answer>' line")
    return Problem(pid, row["question"], gold, row["answer"])


def released_math_gold(solution: str) -> str:
    """The gold answer as the paper's single-GPU code read it (3fc107e:utils/data.py:L134-140): the
    text after the last `\\boxed{` up to the first `}`, so `\\boxed{\\frac{1}{2}}` gives `\\frac{1`
    and such problems could never be answered correctly. "" when there is no `\\boxed{` (their None).
    `task.math_gold: released` trains on these; pods-bench's default is the balanced `last_boxed`."""
    if "\\boxed{" not in solution:
        return ""
    return solution.split("\\boxed{")[-1].split("}")[0].strip()


def _math(row: dict, split: str, i: int) -> Problem:
    pid = f"math/{split}/{i}"
    gold = _gold_or_fail(last_boxed(row["solution"]), pid, "solution has no \\boxed answer")
    return Problem(pid, row["problem"], gold, row["solution"])


def _math500(row: dict, split: str, i: int) -> Problem:
    return Problem(f"math500/{row['unique_id']}", row["problem"], str(row["answer"]).strip(), row["solution"])


def _amc23(row: dict, split: str, i: int) -> Problem:
    return Problem(f"amc23/{split}/{row['id']}", row["question"], number_text(row["answer"]))


MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)

register_task(HubTask("gsm8k", "openai/gsm8k", ("main",), ("train", "test"), ("question", "answer"), _gsm8k))
register_task(
    HubTask("math", "EleutherAI/hendrycks_math", MATH_SUBJECTS, ("train", "test"), ("problem", "solution"), _math)
)
register_task(
    HubTask(
        "math500",
        "HuggingFaceH4/MATH-500",
        (None,),
        ("test",),
        ("problem", "answer", "unique_id", "solution"),
        _math500,
    )
)
register_task(HubTask("amc23", "zwhe99/amc23", (None,), ("test",), ("question", "answer", "id"), _amc23))
