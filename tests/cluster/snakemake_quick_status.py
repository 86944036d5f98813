"""`python tests/cluster/snakemake_quick_status.py ARGS...`: Snakemake, with the SLURM plugin's status
checks at most QUICK_STATUS_S apart. For the SLURM tests only; users run Snakemake itself.

Why: after every status check that finds no job finished, the plugin waits 10 s longer before the
next one, up to 180 s (a fixed rule in its Executor.check_active_jobs; no setting changes it). On the
one-node test cluster a job takes seconds, so a job that ran 30 s was seen finished only ~60 s after
it started, and that back-off was most of the SLURM tests' wall time. Nothing under test (sbatch, the
resources SLURM records, cancellation, resume) depends on how often the status is read.
"""

import asyncio
import runpy

import snakemake_executor_plugin_slurm

QUICK_STATUS_S = 2.0


async def _sleep_at_most_quick_status(self):
    await asyncio.sleep(min(self.next_seconds_between_status_checks, QUICK_STATUS_S))


snakemake_executor_plugin_slurm.Executor.sleep = _sleep_at_most_quick_status
runpy.run_module("snakemake", run_name="__main__", alter_sys=True)
