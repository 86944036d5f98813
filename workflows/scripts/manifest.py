"""Write the run manifest of an experiment (run by Snakemake's `script:`).

One YAML file: the experiment config as run (schema defaults filled in), the hardware setup asked
for, the calibration of a budget in baseline steps (the measured seconds per step and the resolved
budget), and for every run its resolved trainer config, status, times, package versions and the
hardware it actually ran on -- all read from the runs' own run.json files.
"""

import json
from pathlib import Path

import yaml

from pods_bench.errors import PodsBenchError
from pods_bench.io import atomic_write_text
from pods_bench.run_dir import RUN_JSON, load_run_json

snakemake = globals()["snakemake"]  # injected by Snakemake


def read_run(folder: str) -> dict:
    try:
        run = load_run_json(Path(folder) / RUN_JSON)
    except PodsBenchError as e:  # a broken run.json is recorded, not a failed manifest
        return {"run_dir": folder, "status": str(e)}
    if run is None:
        return {"run_dir": folder, "status": f"missing {RUN_JSON}"}
    keep = ("arm", "seed", "status", "started_at", "finished_at", "scheduler_jobs", "hardware", "versions", "config")
    return {"run_dir": folder, **{key: run.get(key) for key in keep}}


runs = [read_run(folder) for folder in snakemake.params.runs]
manifest = {
    "experiment": snakemake.params.experiment_config["experiment"],
    "config_files": list(snakemake.params.config_files),
    "experiment_config": snakemake.params.experiment_config,
    "hardware_setup": snakemake.params.hardware,
    "calibration": (
        json.loads(Path(snakemake.params.calibration).read_text(encoding="utf-8"))
        if snakemake.params.calibration
        else None
    ),
    "runs": runs,
}
manifest = json.loads(json.dumps(manifest, default=str))  # plain data: no YAML anchors for shared objects
atomic_write_text(snakemake.output[0], yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True))
with open(snakemake.log[0], "w", encoding="utf-8") as log:
    log.write(f"{len(runs)} runs -> {snakemake.output[0]}\n")
