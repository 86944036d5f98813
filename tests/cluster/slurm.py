"""A one-node SLURM cluster on the machine this runs on, for testing profiles/slurm for real.

    python -m tests.cluster.slurm            # start it, print how to use it, stop it on Ctrl-C
    with OneNodeSlurm(folder) as cluster:   # from Python: cluster.env has SLURM_CONF for sbatch & co.

It starts, as root, every daemon SLURM needs with its state under `folder`: munged (its own key and
socket), a MariaDB server (its own data folder, on a free port of 127.0.0.1) for slurmdbd, slurmdbd
(accounting: the executor plugin reads job states with sacct), slurmctld and slurmd. The node is
this machine with its CPUs and most of its memory, and a typed GPU resource with no device behind it
(`gpu:<model>:<n>`, File=/dev/null), so that SLURM accepts and shows GPU requests of jobs that never
run on a GPU. Ports are picked free at start, so it runs beside other programs and clusters.
The cluster has one account (`pods`, the default of the user running it) and one partition
(`debug`, not the default partition, so a job that names no partition is rejected as on many real
clusters... unless `default_partition=True`); accounts are enforced.

Missing Debian packages (slurm-wlm, slurmdbd, munge, mariadb-server) are installed with apt-get.
Stopping cancels every job, then ends each daemon it started by its process id (SIGTERM, SIGKILL after
a grace period), and any process left with this cluster's SLURM_CONF in its environment (job steps
that outlived slurmd). Nothing else on the machine is touched: no system config file, no service.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

PACKAGES = ["slurm-wlm", "slurmdbd", "munge", "mariadb-server"]
PROGRAMS = ["munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd", "sbatch", "sacctmgr"]
ACCOUNT = "pods"
PARTITION = "debug"
CLUSTER = "podsbench"
GPU_MODEL = "l40s"  # the GPU type declared on the node (config/hardware.yaml's l40s setup asks for it)


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the cluster (not root, no apt-get, no packages): the reason."""


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports of 127.0.0.1 that are free now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def install_packages() -> None:
    """The Debian packages, with apt-get, where a program is missing (CI machines start bare)."""
    if all(shutil.which(p) for p in PROGRAMS):
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable("SLURM's programs are missing and installing them needs root")
    if not shutil.which("apt-get"):
        raise SlurmUnavailable("SLURM's programs are missing and this machine has no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", *PACKAGES]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        # a fresh machine has no package lists yet
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
        out = subprocess.run(install, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SlurmUnavailable(f"apt-get install {' '.join(PACKAGES)} failed: {out.stderr.strip()[-500:]}")
    missing = [p for p in PROGRAMS if not shutil.which(p)]
    if missing:
        raise SlurmUnavailable(f"installed {' '.join(PACKAGES)} but {', '.join(missing)} still missing")


class OneNodeSlurm:
    """The cluster as a context manager; `env` is what a command needs to use it (SLURM_CONF)."""

    def __init__(self, folder: str | Path | None = None, gpus: int = 1, default_partition: bool = False):
        self.folder = Path(folder or tempfile.mkdtemp(prefix="pods-slurm-")).resolve()
        self.gpus = gpus
        self.default_partition = default_partition
        self.node = socket.gethostname().split(".")[0]
        self.user = getpass.getuser()
        self.daemons: dict[str, subprocess.Popen] = {}
        self.conf = self.folder / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # --- start -------------------------------------------------------------------------------------

    def __enter__(self) -> OneNodeSlurm:
        if os.geteuid() != 0:
            raise SlurmUnavailable("a one-node SLURM needs root (its daemons run as root here)")
        install_packages()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        for sub in ("etc", "log", "run", "munge", "db", "ctld", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(("ctld", "slurmd", "dbd", "db"), free_ports(4)))
        self._start_munge()
        self._start_mariadb()
        self._write_configs()
        self._start_daemon("slurmdbd", ["slurmdbd", "-D"])
        self._wait(lambda: self._run("sacctmgr", "-n", "list", "cluster", check=False).returncode == 0, "slurmdbd")
        self._run("sacctmgr", "-i", "add", "cluster", CLUSTER)
        self._run("sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={CLUSTER}", "description=pods-bench tests")
        self._run("sacctmgr", "-i", "add", "user", self.user, f"account={ACCOUNT}", f"defaultaccount={ACCOUNT}")
        self._start_daemon("slurmctld", ["slurmctld", "-D", "-i"])
        self._start_daemon("slurmd", ["slurmd", "-D", "-N", self.node])
        self._wait(self._node_idle, "the node to be idle")

    def _start_munge(self) -> None:
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = self.folder / "munge" / "munge.socket"
        self._start_daemon(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",  # root-owned temp folders: munged's checks are for a system install
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.folder / 'run' / 'munged.pid'}",
                f"--log-file={self.folder / 'log' / 'munged.log'}",
                f"--seed-file={self.folder / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait(self.munge_socket.exists, "munged")

    def _start_mariadb(self) -> None:
        data = self.folder / "db"
        self.db_socket = self.folder / "run" / "mariadb.sock"
        install = [
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={data}",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]
        self._checked(install)
        self._start_daemon(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                f"--socket={self.db_socket}",
                f"--port={self.ports['db']}",
                "--bind-address=127.0.0.1",
                f"--pid-file={self.folder / 'run' / 'mariadb.pid'}",
                f"--log-error={self.folder / 'log' / 'mariadb.log'}",
                "--innodb-buffer-pool-size=64M",
            ],
        )
        client = ["mariadb", "--no-defaults", f"--socket={self.db_socket}", "-uroot"]
        self._wait(
            lambda: subprocess.run([*client, "-e", "select 1"], capture_output=True).returncode == 0, "mariadbd"
        )
        self._checked(
            [
                *client,
                "-e",
                "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';",
            ]
        )

    def _write_configs(self) -> None:
        f, cpus = self.folder, os.cpu_count() or 1
        # most of the memory: slurmd refuses a node declared with more than it has
        memory_mb = int(psutil.virtual_memory().total / 2**20 * 0.8)
        auth = f"AuthInfo=socket={self.munge_socket}"
        self.conf.write_text(
            "\n".join(
                [
                    f"ClusterName={CLUSTER}",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={self.ports['ctld']}",
                    f"SlurmdPort={self.ports['slurmd']}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    auth,
                    "CredType=cred/munge",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core_Memory",
                    "GresTypes=gpu",
                    "MpiDefault=none",
                    f"StateSaveLocation={f / 'ctld'}",
                    f"SlurmdSpoolDir={f / 'spool'}",
                    f"SlurmctldPidFile={f / 'run' / 'slurmctld.pid'}",
                    f"SlurmdPidFile={f / 'run' / 'slurmd.pid'}",
                    f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={f / 'log' / 'slurmd.log'}",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    "AccountingStorageHost=127.0.0.1",
                    f"AccountingStoragePort={self.ports['dbd']}",
                    # for slurmdbd connections the munge socket is this key, not AuthInfo (slurm.conf(5))
                    f"AccountingStoragePass={self.munge_socket}",
                    "AccountingStorageEnforce=associations,limits",
                    "AccountingStorageTRES=gres/gpu",
                    "AccountingStoreFlags=job_comment",  # the plugin's comment names each job's rule
                    "JobCompType=jobcomp/none",
                    # quick scheduling and a quick end to cancelled jobs: this cluster serves tests
                    "SchedulerParameters=sched_interval=2",
                    "KillWait=5",
                    "MinJobAge=3600",  # finished jobs stay visible to scontrol for the checks
                    "ReturnToService=2",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} "
                    f"Gres=gpu:{GPU_MODEL}:{self.gpus} State=UNKNOWN",
                    f"PartitionName={PARTITION} Nodes={self.node} MaxTime=INFINITE State=UP"
                    + (" Default=YES" if self.default_partition else " Default=NO"),
                    "",
                ]
            )
        )
        # a GPU with no device behind it: SLURM schedules and records it, nothing uses it
        (f / "etc" / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu Type={GPU_MODEL} File=/dev/null Count={self.gpus}\n"
        )
        dbd = f / "etc" / "slurmdbd.conf"
        dbd.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    auth,
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.ports['dbd']}",
                    "SlurmUser=root",
                    f"PidFile={f / 'run' / 'slurmdbd.pid'}",
                    f"LogFile={f / 'log' / 'slurmdbd.log'}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.ports['db']}",
                    "StorageUser=slurm",
                    "StoragePass=slurm",
                    "StorageLoc=slurm_acct_db",
                    "",
                ]
            )
        )
        dbd.chmod(0o600)  # slurmdbd refuses a config others can read (it holds the password)

    def _start_daemon(self, name: str, command: list[str]) -> None:
        log = open(self.folder / "log" / f"{name}.out", "ab")
        self.daemons[name] = subprocess.Popen(
            command,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def _node_idle(self) -> bool:
        out = self._run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return out.returncode == 0 and out.stdout.strip() == "idle"

    def _wait(self, condition, what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            dead = {n: p.returncode for n, p in self.daemons.items() if p.poll() is not None}
            if dead:
                raise SlurmUnavailable(f"waiting for {what}: {dead} exited; logs in {self.folder / 'log'}")
            if time.monotonic() >= deadline:
                raise SlurmUnavailable(f"waited {timeout_s} s for {what}; logs in {self.folder / 'log'}")
            time.sleep(0.2)

    def _checked(self, command: list[str]) -> subprocess.CompletedProcess:
        out = subprocess.run(command, env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SlurmUnavailable(f"{' '.join(command)} failed: {(out.stderr or out.stdout).strip()[-500:]}")
        return out

    def _run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        if check:
            return self._checked(list(command))
        return subprocess.run(list(command), env=self.env, capture_output=True, text=True)

    # --- use ---------------------------------------------------------------------------------------

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        """A SLURM command (sbatch, squeue, scontrol, sacct, ...) against this cluster."""
        return self._run(*command, check=check)

    def cluster_processes(self) -> list[psutil.Process]:
        """Live processes with this cluster's SLURM_CONF in their environment: its daemons, job steps
        and whatever they started."""
        found = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("SLURM_CONF") == str(self.conf) and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    # --- stop --------------------------------------------------------------------------------------

    def stop(self, grace_s: float = 15) -> None:
        """Cancel every job, then end every daemon started here by its pid, and any job process left."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self._run("scancel", "--full", f"--user={self.user}", check=False)
            with contextlib.suppress(SlurmUnavailable):
                self._wait(lambda: not self._run("squeue", "-h", check=False).stdout.strip(), "jobs to end", 30)
        # the reverse order of starting: slurmd and slurmctld before the accounting they report to
        for name in reversed(list(self.daemons)):
            proc = self.daemons[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        left = self.cluster_processes()
        for p in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(left, timeout=grace_s)
        self.daemons.clear()


def _stop_on_signal(signum, frame):
    raise KeyboardInterrupt


def main() -> int:
    folder = sys.argv[1] if len(sys.argv) > 1 else None
    # Ctrl-C or a kill stops the cluster (also where the shell started this with SIGINT ignored)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_on_signal)
    try:
        with OneNodeSlurm(folder) as cluster:
            print(f"one-node SLURM up: export SLURM_CONF={cluster.conf}", flush=True)
            print(f"  account {ACCOUNT}, partition {PARTITION}, node {cluster.node}; Ctrl-C stops it", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    except SlurmUnavailable as e:
        print(f"one-node SLURM: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
