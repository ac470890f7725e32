"""A one-node Slurm cluster on this machine for the tests: munged, slurmctld and slurmd (Debian's
`munge` and `slurm-wlm`), their own key, socket, ports and spool in a fresh folder, the node at
127.0.0.1. `start()` gives the environment that points sbatch, squeue and scancel at it (SLURM_CONF),
or raises `Unavailable` saying why it could not start; `stop()` cancels every job and stops the
three daemons, so a test leaves no process behind."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CONF = """ClusterName=fmtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser={user}
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
PlugStackConfig={dir}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=10
InactiveLimit=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
DAEMONS = ("munged", "slurmctld", "slurmd")


class Unavailable(RuntimeError):
    """A Slurm cluster cannot be started here (why, in the message)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    folder: Path
    env: dict[str, str]

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm command (squeue, scancel, scontrol) against this cluster; its output."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def stop(self) -> None:
        self.run("scancel", "-u", getpass.getuser(), check=False)
        time.sleep(1)
        for name in ("slurmd", "slurmctld", "munged"):
            _kill(self.folder / f"{name}.pid")
        shutil.rmtree(self.folder, ignore_errors=True)


def _kill(pidfile: Path) -> None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def start(cpus: int = 2) -> Cluster:
    missing = [d for d in (*DAEMONS, "mungekey", "sbatch", "squeue") if shutil.which(d) is None]
    missing = [d for d in missing if not Path("/usr/sbin", d).exists()]
    if missing:
        raise Unavailable(f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        raise Unavailable("slurmd must run as root to start jobs")
    folder = Path(tempfile.mkdtemp(prefix="fm-slurm-"))  # short: a socket path has ~100 bytes
    os.chmod(folder, 0o755)
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    (folder / "plugstack.conf").write_text("")
    conf = CONF.format(dir=folder, ctld_port=_free_port(), d_port=_free_port(), user="root", cpus=cpus)
    (folder / "slurm.conf").write_text(conf)
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    cluster = Cluster(folder, env)
    sbin = "/usr/sbin/"
    key = folder / "munge.key"
    steps = [
        [sbin + "mungekey", "-c", "-k", str(key)],
        [
            sbin + "munged", "-f", f"--key-file={key}", f"--socket={folder}/munge.sock",
            f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
            f"--seed-file={folder}/munged.seed",
        ],
        [sbin + "slurmctld", "-f", str(folder / "slurm.conf"), "-i"],
        [sbin + "slurmd", "-f", str(folder / "slurm.conf"), "-N", "localhost"],
    ]  # fmt: skip
    try:
        for argv in steps:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise Unavailable(f"{Path(argv[0]).name} did not start: {done.stderr.strip()[-500:]}")
            if argv[0].endswith("mungekey"):
                os.chmod(key, 0o600)
        _until_idle(cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _until_idle(cluster: Cluster, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        out = cluster.run("sinfo", "-h", "-o", "%T", check=False).strip()
        if out in ("idle", "mixed", "allocated"):
            return
        time.sleep(0.5)
    logs = "".join(
        (cluster.folder / f).read_text()[-400:]
        for f in ("slurmctld.log", "slurmd.log")
        if (cluster.folder / f).is_file()
    )
    raise Unavailable(f"the node did not come up within {within_s:.0f} s: {logs}")
