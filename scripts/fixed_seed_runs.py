"""Fixed-seed tiny training runs, one per registered allocation strategy (with its
`example_settings`) and one per registered selection rule, whose train_log.jsonl and eval.jsonl
(timing fields removed) are written to an output folder: run it before and after a change that
must not change behaviour, and compare the two folders (`diff -r before after`).

    PODS_BENCH_DATA_DIR=... python scripts/fixed_seed_runs.py /tmp/before
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pods_bench.allocation import ALLOCATION_STRATEGIES  # noqa: E402
from pods_bench.config import config_from_dict  # noqa: E402
from pods_bench.errors import PodsBenchError  # noqa: E402
from pods_bench.selection import SELECTION_RULES  # noqa: E402
from pods_bench.train import train  # noqa: E402
from tests.tiny_runs import read_lines, tiny_run, without_timings  # noqa: E402

RULE_SETTINGS = {"all": {"m": 4}}  # "all" keeps every rollout: m == n


def runs() -> dict[str, dict]:
    """run name -> sections updating tests/tiny_runs.py's TINY_RUN."""
    out = {}
    for strategy in ALLOCATION_STRATEGIES:
        example = ALLOCATION_STRATEGIES[strategy].example_settings
        section = {strategy: dict(example)} if example else {}
        out[f"allocation-{strategy}"] = {"allocation": {"strategy": strategy, **section}}
    for rule in SELECTION_RULES:
        out[f"selection-{rule}"] = {"selection": {"rule": rule, **RULE_SETTINGS.get(rule, {})}}
    out["selection-max_abs_advantage-batch"] = {
        "selection": {"rule": "max_abs_advantage", "advantage_over": "all", "scope": "batch"}
    }
    out["allocation-uniform-groups_per_prompt-2"] = {"selection": {"groups_per_prompt": 2}}
    return out


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, sections in runs().items():
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            settings = tiny_run(run_dir, budget={"max_steps": 2}, **sections)
            try:
                train(config_from_dict(settings), progress=False)
            except PodsBenchError as e:
                (out / f"{name}.error.txt").write_text(f"{e}\n")
                print(name, "error:", e)
                continue
            for log in ("train_log.jsonl", "eval.jsonl"):
                records = without_timings(read_lines(run_dir / log))
                text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
                (out / f"{name}.{log}").write_text(text)
            print(name, "ok")


if __name__ == "__main__":
    main(sys.argv[1])
