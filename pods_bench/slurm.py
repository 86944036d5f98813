"""SLURM: the job a process runs in (recorded in run.json), and the check of a workflow's account and
partition against the cluster before any job is submitted (profiles/slurm).

The executor plugin submits each job with `sbatch -A <slurm_account> -p <slurm_partition>`; a cluster
that rejects either fails every job one by one, each with a long sbatch message (an account the
cluster does not know even with a traceback). The check turns that into one line before the first
submission.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from collections.abc import Iterable

from pods_bench.errors import PodsBenchError

# environment variables SLURM sets in a job -> the run.json field
_JOB_FIELDS = {
    "SLURM_JOB_ID": "job_id",
    "SLURM_CLUSTER_NAME": "cluster",
    "SLURM_JOB_PARTITION": "partition",
    "SLURM_JOB_ACCOUNT": "account",
    "SLURMD_NODENAME": "node",
}


def current_job() -> dict | None:
    """The SLURM job this process runs in (id, cluster, partition, account, node), or None."""
    if not os.environ.get("SLURM_JOB_ID"):
        return None
    return {field: os.environ.get(var) for var, field in _JOB_FIELDS.items()}


def _query(command: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        raise PodsBenchError(f"SLURM: `{' '.join(command)}` did not answer within 60 s") from e


def partitions() -> tuple[list[str], str | None]:
    """(the cluster's partitions, its default partition or None), from sinfo."""
    if not shutil.which("sinfo"):
        raise PodsBenchError("SLURM: sinfo not found; profiles/slurm submits from a machine with SLURM's commands")
    out = _query(["sinfo", "-h", "-o", "%P"])
    if out.returncode != 0:
        raise PodsBenchError(f"SLURM: sinfo failed: {' '.join(out.stderr.split())[:300]}")
    names = list(dict.fromkeys(line.strip() for line in out.stdout.splitlines() if line.strip()))
    default = next((n.rstrip("*") for n in names if n.endswith("*")), None)
    return [n.rstrip("*") for n in names], default


def user_accounts(user: str) -> list[str] | None:
    """The accounts `user` may submit to, from sacctmgr; None where the cluster keeps no accounting."""
    if not shutil.which("sacctmgr"):
        return None
    out = _query(["sacctmgr", "-n", "-P", "show", "associations", f"user={user}", "format=account"])
    if out.returncode != 0:  # accounting disabled or slurmdbd unreachable: sbatch decides alone
        return None
    return sorted({line.strip() for line in out.stdout.splitlines() if line.strip()})


def check_submission(settings: Iterable[tuple[str | None, str | None]]) -> None:
    """Every (slurm_account, slurm_partition) the workflow's jobs will be submitted with names an
    account of this user and a partition of this cluster; no partition needs a default one.
    Raises PodsBenchError with one line otherwise."""
    settings = set(settings)
    names, default = partitions()
    fix = "--default-resources slurm_account=<account> slurm_partition=<partition>"
    for _, partition in sorted(settings, key=str):
        if partition is None and default is None:
            raise PodsBenchError(
                f"SLURM: no partition given and the cluster has no default partition; "
                f"choose one of {', '.join(names) or '(none)'} with {fix}"
            )
        if partition is not None and partition not in names:
            raise PodsBenchError(
                f"SLURM: partition '{partition}' does not exist on this cluster "
                f"(partitions: {', '.join(names) or '(none)'}); set it with {fix}"
            )
    user = getpass.getuser()
    accounts = user_accounts(user)
    if accounts is None:
        return
    for account, _ in sorted(settings, key=str):
        if account is not None and account.lower() not in {a.lower() for a in accounts}:
            raise PodsBenchError(
                f"SLURM: account '{account}' is not one of user {user}'s accounts on this cluster "
                f"({', '.join(accounts) or 'none'}); set it with {fix}"
            )
        if account is None and not accounts:
            raise PodsBenchError(f"SLURM: user {user} has no account on this cluster; set one with {fix}")
