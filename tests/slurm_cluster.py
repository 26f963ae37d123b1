"""A real single-node Slurm for the provider's tests: munged, slurmctld and slurmd started from
Debian's packages with a config written here (this host, its CPUs, no cgroups, no accounting
daemon, a job-completion log that ``sacct -c`` reads), everything on loopback, and every daemon
stopped again by its PID file at the end. Nothing outside the fixture's folder is changed:
munged gets its own key, socket and PID file, and the clients find the config through
``SLURM_CONF``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
# The tests that start daemons run on one pytest-xdist worker, one after another: a Ray head's
# teardown (`ray stop --force`) stops every Ray process on the machine (the Ray a Slurm job starts
# too), and the session's test Slurm is started once, not once per worker.
ON_ONE_WORKER = pytest.mark.xdist_group("daemons")
# Where Ray looks for token authentication's mode and token (besides ~/.ray/auth_token): a test
# that starts Ray clears them and gives Ray a home of its own, so the token of whoever runs the
# tests can neither switch a test's Ray to token mode nor end up in a test's files.
RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
INSTALL = ("apt-get install slurmctld slurmd slurm-client munge (Debian's Slurm, run as root; "
           ".ci/run installs it)")


def missing() -> str | None:
    """Why a real Slurm cannot start here, with what to do; None when it can."""
    absent = [d for d in DAEMONS if shutil.which(d) is None and
              not Path("/usr/sbin", d).exists()]
    if absent:
        return f"no Slurm here ({', '.join(absent)} missing): {INSTALL}"
    if os.geteuid() != 0:
        return f"a single-node Slurm runs its daemons as root: run the tests as root ({INSTALL})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _daemon(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass(frozen=True)
class Cluster:
    folder: Path
    conf: Path
    env: dict[str, str]

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                              check=False, timeout=60)


def _config(folder: Path, munge_socket: Path, two_nodes: bool = False) -> str:
    host = socket.gethostname().split(".")[0]
    if two_nodes:  # two slurmd on this host, one CPU each, as two machines of one CPU
        nodes = [f"NodeName=node{i} NodeHostname={host} NodeAddr=127.0.0.1 "
                 f"Port={_free_port()} CPUs=1 RealMemory=2000 State=UNKNOWN" for i in (1, 2)]
        partitions = ["PartitionName=two Nodes=node1,node2 Default=YES MaxTime=INFINITE "
                      "State=UP"]
        slurmd = [f"SlurmdSpoolDir={folder}/spool-%n", f"SlurmdPidFile={folder}/slurmd-%n.pid",
                  f"SlurmdLogFile={folder}/slurmd-%n.log"]
    else:
        nodes = [f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=2000 "
                 "State=UNKNOWN"]
        partitions = [
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            # a partition with a time cap, as most clusters have, for jobs it can never start
            "PartitionName=short Nodes=ALL MaxTime=00:05:00 State=UP"]
        slurmd = [f"SlurmdSpoolDir={folder}/spool", f"SlurmdPidFile={folder}/slurmd.pid",
                  f"SlurmdLogFile={folder}/slurmd.log"]
    return "\n".join([
        "ClusterName=stateset-test", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket}",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "MpiDefault=none", "MailProg=/bin/true", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={folder}/jobcomp.log", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0", "ReturnToService=2", "KillWait=5",
        "MinJobAge=300", "InactiveLimit=0", f"StateSaveLocation={folder}/state",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmctldLogFile={folder}/slurmctld.log",
        *slurmd, *nodes, *partitions, ""])


def _stop(pid_files: list[Path]) -> None:
    for path in reversed(pid_files):
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):  # it may end just now, under load
                os.kill(pid, signal.SIGKILL)


@contextmanager
def _cluster(folder: Path, two_nodes: bool = False) -> Iterator[Cluster]:
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir()
    munge = folder / "munge"
    key, sock, munge_pid = munge / "munge.key", munge / "munge.socket", munge / "munged.pid"
    subprocess.run([_daemon("mungekey"), "--create", f"--keyfile={key}"], check=True,
                   capture_output=True)
    key.chmod(0o600)
    conf = folder / "slurm.conf"
    conf.write_text(_config(folder, sock, two_nodes))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    names = ["node1", "node2"] if two_nodes else [None]
    slurmd_pids = [folder / (f"slurmd-{n}.pid" if n else "slurmd.pid") for n in names]
    pid_files = [munge_pid, folder / "slurmctld.pid", *slurmd_pids]
    try:
        subprocess.run([_daemon("munged"), "--force", f"--key-file={key}", f"--socket={sock}",
                        f"--pid-file={munge_pid}", f"--log-file={munge / 'munged.log'}",
                        f"--seed-file={munge / 'munged.seed'}"], check=True,
                       capture_output=True)
        subprocess.run([_daemon("slurmctld"), "-i", "-f", str(conf)], check=True, env=env,
                       capture_output=True)
        for name in names:
            subprocess.run([_daemon("slurmd"), "-f", str(conf), *(["-N", name] if name else [])],
                           check=True, env=env, capture_output=True)
        cluster = Cluster(folder, conf, env)
        deadline = time.monotonic() + 30
        # a node in two partitions is listed twice
        while set(cluster.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()) != {"idle"}:
            if time.monotonic() > deadline:
                logs = "\n".join(f.read_text()[-800:] for f in sorted(folder.glob("slurm*.log")))
                raise RuntimeError(f"the test Slurm did not come up:\n{logs}")
            time.sleep(0.25)
        yield cluster
    finally:
        _stop(pid_files)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Iterator[Cluster]:
    why = missing()
    if why:
        pytest.skip(why)
    with _cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_two_nodes(tmp_path_factory) -> Iterator[Cluster]:
    """Two nodes of one CPU each: two slurmd on this host (node1, node2), for jobs that span
    nodes; its own controller, so the single-node cluster's jobs never wait for it."""
    why = missing()
    if why:
        pytest.skip(why)
    with _cluster(tmp_path_factory.mktemp("slurm2"), two_nodes=True) as cluster:
        yield cluster
