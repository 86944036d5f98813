"""Resuming a run: rerunning the same command continues from the newest complete checkpoint of its
run folder. A folder is resumed only by the same config (`check_same_run`); the trainer takes the
folder's lock, and the logs are cut back to the checkpoint it resumes from, so that no record is
lost or doubled (`open_run_folder`). tests/test_crash_resume.py kills runs at ten moments.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

from pods_bench import checkpoint as ckpt
from pods_bench import run_dir as run_folder
from pods_bench.config import TrainConfig, flatten
from pods_bench.errors import PodsBenchError
from pods_bench.io import locked, remove_temporaries, truncate_jsonl
from pods_bench.run_dir import EVAL_LOCK, EVAL_LOG, RUN_JSON, TRAIN_LOCK, TRAIN_LOG

# Config keys that may change when a run is resumed (e.g. a larger budget); anything else must match.
RESUMABLE_CHANGES = ("budget.", "eval.", "reward.workers")


def check_same_run(run: dict, cfg: TrainConfig) -> None:
    """A run folder is resumed only by the same config (budget and evaluation may change)."""
    as_flat = lambda c: flatten(json.loads(json.dumps(c.to_dict(), default=str)))
    old, new, defaults = flatten(run["config"]), as_flat(cfg), as_flat(TrainConfig())
    for key in sorted(set(old) | set(new)):
        if key.startswith(RESUMABLE_CHANGES) or unused_plugin_setting(key, cfg):
            continue
        if key not in old and new.get(key) == defaults.get(key):
            continue  # a setting added to pods-bench since the run started, at its default value
        if old.get(key) != new.get(key):
            raise PodsBenchError(
                f"{cfg.run_dir} holds a run with another config ({key}: {old.get(key)!r} there, "
                f"{new.get(key)!r} now); choose another output_dir"
            )


def unused_plugin_setting(key: str, cfg: TrainConfig) -> bool:
    """Whether dotted `key` is a setting of an allocation strategy or selection rule the run does not
    use: run.json records the chosen one's settings in full and the others' as given (a run.json
    written before the sections were typed at check time holds every registered one's defaults)."""
    parts = key.split(".")
    for name, section in [("allocation", cfg.allocation), ("selection", cfg.selection)]:
        if parts[0] == name and len(parts) > 2 and parts[1] not in (*section.own_fields(), section.chosen()):
            return True
    return False


def where_to_start(cfg: TrainConfig) -> tuple[dict | None, Path | None]:
    """(previous run.json, checkpoint to resume from): both None for a fresh run. Reads only."""
    run_dir = cfg.run_dir
    previous = run_folder.read_run_json(run_dir) if (run_dir / RUN_JSON).is_file() else None
    if previous is not None:
        check_same_run(previous, cfg)
    elif ckpt.list_checkpoints(run_dir):
        raise PodsBenchError(f"{run_dir} holds checkpoints but no {RUN_JSON}; choose another output_dir")
    return previous, ckpt.latest_checkpoint(run_dir) if previous is not None else None


def open_run_folder(cfg: TrainConfig, resume_from: Path | None, step: int, lock: ExitStack) -> None:
    """Make the run folder ours while we train (a second trainer of it stops here, `lock` holds the
    flock) and cut its logs back to the checkpoint we resume from, so no record is lost or doubled."""
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    busy = f"{run_dir} is being trained by another process (it holds {TRAIN_LOCK}); stop it first"
    lock.enter_context(locked(run_dir / TRAIN_LOCK, busy=busy))
    # the resume point was chosen before the lock: a trainer that held it meanwhile may have
    # written a newer checkpoint (an orphan of a killed job finishing its run)
    latest = ckpt.latest_checkpoint(run_dir)
    if latest != resume_from:
        raise PodsBenchError(
            f"{run_dir} changed while this trainer started (another process wrote "
            f"{latest.name if latest else 'or removed its checkpoints'}); "
            "rerun the same command to resume from it"
        )
    ckpt.remove_incomplete(run_dir)
    remove_temporaries(run_dir)

    def keep(record: dict) -> bool:
        return resume_from is not None and record["step"] <= step

    truncate_jsonl(run_dir / TRAIN_LOG, keep)
    with locked(run_dir / EVAL_LOCK):
        truncate_jsonl(run_dir / EVAL_LOG, keep)
