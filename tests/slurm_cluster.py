"""A real single-node SLURM cluster for the tests (munge + slurmctld + slurmd), set up
the way RECIPES describes: it needs root and Debian's slurm-wlm and munge, which
.ci/run installs. ``start_cluster`` says why when it cannot start one."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CONF = Path("/etc/slurm/slurm.conf")
MUNGE_KEY = Path("/etc/munge/munge.key")


@dataclass
class Cluster:
    spool: Path
    started_munge: bool

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld"):
            pid_file = self.spool / f"{name}.pid"
            if pid_file.exists():
                _kill(int(pid_file.read_text()))
            subprocess.run(["pkill", "-x", name], check=False)  # one that died before its pid file
        if self.started_munge:
            subprocess.run(["pkill", "-x", "munged"], check=False)
        shutil.rmtree(self.spool, ignore_errors=True)


def missing() -> str | None:
    """Why no cluster can start here, or None."""
    if os.geteuid() != 0:
        return "a SLURM cluster needs root (CI runs as root)"
    lacking = [tool for tool in ("slurmctld", "slurmd", "sbatch", "munged", "munge") if shutil.which(tool) is None]
    if lacking:
        return f"SLURM tests need Debian's slurm-wlm and munge (.ci/run installs them); missing {', '.join(lacking)}"
    return None


def start_cluster() -> Cluster:
    """Its files live under /var/spool: slurmctld runs as user slurm, which cannot reach
    into pytest's own (root's) temporary folders."""
    started_munge = _start_munge()
    host = socket.gethostname().split(".")[0]
    spool = Path(tempfile.mkdtemp(prefix="troupe-slurm-", dir="/var/spool"))
    spool.chmod(0o755)
    for sub in ("ctld", "d"):
        (spool / sub).mkdir(exist_ok=True)
    shutil.chown(spool / "ctld", "slurm", "slurm")
    CONF.parent.mkdir(parents=True, exist_ok=True)
    CONF.write_text("\n".join((
        "# written by troupe's tests for a single-node cluster",
        "ClusterName=troupe-tests", f"SlurmctldHost={host}", "AuthType=auth/munge", "SlurmUser=slurm",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "ReturnToService=2", "SchedulerType=sched/backfill",
        f"StateSaveLocation={spool / 'ctld'}", f"SlurmdSpoolDir={spool / 'd'}",
        f"SlurmctldPidFile={spool / 'slurmctld.pid'}", f"SlurmdPidFile={spool / 'slurmd.pid'}",
        f"SlurmctldLogFile={spool / 'slurmctld.log'}", f"SlurmdLogFile={spool / 'slurmd.log'}",
        "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        f"NodeName={host} CPUs={os.cpu_count() or 1} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8",
    )) + "\n")
    subprocess.run(["slurmctld"], check=True)
    subprocess.run(["slurmd"], check=True)
    cluster = Cluster(spool, started_munge)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True).stdout.strip()
        if state.startswith(("idle", "mixed")):
            return cluster
        time.sleep(0.2)
    cluster.stop()
    raise RuntimeError(f"the SLURM node did not come up: sinfo says {state!r}; see {spool}")


def _start_munge() -> bool:
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
        return False
    if not MUNGE_KEY.exists():
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        MUNGE_KEY.write_bytes(secrets.token_bytes(1024))
    for path in (MUNGE_KEY.parent, Path("/run/munge"), Path("/var/lib/munge"), Path("/var/log/munge")):
        path.mkdir(parents=True, exist_ok=True)
        shutil.chown(path, "munge", "munge")
    shutil.chown(MUNGE_KEY, "munge", "munge")
    MUNGE_KEY.chmod(0o400)
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True)
    return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
