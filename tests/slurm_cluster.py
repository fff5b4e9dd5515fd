"""A real single-node SLURM cluster for the tests: munge, slurmctld and slurmd on this machine.

Debian's packages (``slurmctld slurmd slurm-client munge``) are installed with apt when missing,
which needs root. Everything the cluster writes (config, state, spool, logs) lives in one
folder, clients find it through ``SLURM_CONF``, and the daemons listen on free ports, so a
machine's own SLURM (if any) is never touched. Only the processes started here are stopped,
each checked by its start time first so that a reused PID is never signalled.

Facts behind the settings (measured on the CI machine kind): ``AuthInfo=cred_expire=10`` lets a
requeued job start again in about 12 s instead of 2.5 minutes; proctrack/linuxproc and task/none
need no cgroups; ``ReturnToService=2`` brings the node back after a restart.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "munged")


class ClusterUnavailable(RuntimeError):
    """This machine cannot run the cluster (not root, no apt, not Linux); the reason is the message."""


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass
class _Started:
    name: str
    pid: int
    start_time: str
    process: subprocess.Popen | None = None

    def stop(self, timeout: float = 10.0) -> None:
        if _start_time(self.pid) != self.start_time:
            return  # gone, or the PID now belongs to another process
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _start_time(self.pid) == self.start_time:
            if self.process is not None and self.process.poll() is not None:
                return
            time.sleep(0.1)
        if _start_time(self.pid) == self.start_time:
            os.kill(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def install() -> None:
    """Install the SLURM and munge packages with apt when a binary is missing.

    Raises:
        ClusterUnavailable: not Linux, not root, or apt-get missing or failing.
    """
    if all(shutil.which(name) or Path("/usr/sbin", name).exists() for name in BINARIES):
        return
    if not Path("/proc").is_dir():
        raise ClusterUnavailable("SLURM needs Linux")
    if os.geteuid() != 0:
        raise ClusterUnavailable("SLURM is not installed and installing it with apt needs root")
    if not shutil.which("apt-get"):
        raise ClusterUnavailable("SLURM is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install_packages = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    for command in (["apt-get", "update", "-qq"], install_packages):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise ClusterUnavailable(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


@dataclass
class Cluster:
    """A running single-node cluster; ``env`` is what client commands and jobs need."""

    root: Path
    node: str
    env: dict[str, str]
    started: list[_Started] = field(default_factory=list)

    @classmethod
    def start(cls, root: Path, timeout: float = 60.0) -> Cluster:
        """Install when needed, write the config under ``root``, start the daemons, wait for the node.

        Raises:
            ClusterUnavailable: the machine cannot run SLURM (see ``install``).
            RuntimeError: a daemon did not come up; the message holds its log.
        """
        if os.geteuid() != 0:
            raise ClusterUnavailable("the test cluster runs slurmd as root, and this is not root")
        install()
        node = socket.gethostname().split(".")[0]
        for sub in ("state", "spool", "run", "log"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        hardware = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
        hardware = re.sub(r"^NodeName=\S+\s*", "", hardware)
        conf = root / "slurm.conf"
        conf.write_text(
            "\n".join(
                [
                    "ClusterName=testcluster",
                    f"SlurmctldHost={node}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    "AuthInfo=cred_expire=10",
                    "MpiDefault=none",
                    "MailProg=/bin/true",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=bf_interval=1,sched_interval=2",
                    "ReturnToService=2",
                    "MinJobAge=3600",
                    f"StateSaveLocation={root / 'state'}",
                    f"SlurmdSpoolDir={root / 'spool'}",
                    f"SlurmctldPidFile={root / 'run/slurmctld.pid'}",
                    f"SlurmdPidFile={root / 'run/slurmd.pid'}",
                    f"SlurmctldLogFile={root / 'log/slurmctld.log'}",
                    f"SlurmdLogFile={root / 'log/slurmd.log'}",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    f"NodeName={node} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN",
                    f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        cluster = cls(root=root, node=node, env={**os.environ, "SLURM_CONF": str(conf)})
        try:
            cluster._start_munge()
            for daemon in ("slurmctld", "slurmd"):
                log = (root / "log" / f"{daemon}.stdout").open("w")
                process = subprocess.Popen(
                    [daemon, "-D", "-f", str(conf)], cwd=root, env=cluster.env, stdout=log, stderr=log
                )
                time.sleep(0.2)  # /proc/PID/stat exists from fork on; let the exec happen first
                cluster.started.append(_Started(daemon, process.pid, _start_time(process.pid) or "", process))
            cluster._wait_for_idle_node(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_munge(self) -> None:
        # Reuse a munged that already serves the default socket (it is not ours to stop).
        if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
            return
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True, timeout=30)
        pid = int((run_dir / "munged.pid").read_text())
        self.started.append(_Started("munged", pid, _start_time(pid) or ""))

    def _wait_for_idle_node(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for daemon in self.started:
                if daemon.process is not None and daemon.process.poll() is not None:
                    raise RuntimeError(f"{daemon.name} exited:\n{self.logs()}")
            done = self.command("sinfo", "-h", "-N", "-o", "%T", check=False)
            state = done.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the node did not become idle in {timeout} s (state {state!r}):\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((self.root / "log").glob("*")))

    def stop(self) -> None:
        """Stop the daemons started here (newest first), never anything else."""
        for daemon in reversed(self.started):
            daemon.stop()
        self.started.clear()

    def command(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """Run a SLURM client command (sbatch, scontrol, ...) against this cluster."""
        kwargs.setdefault("env", self.env)
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=60, **kwargs)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done

    def sbatch(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> int:
        """Submit a batch job and return its id."""
        done = self.command("sbatch", "--parsable", *args, cwd=cwd, env={**self.env, **(env or {})})
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...)."""
        text = self.command("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(re.findall(r"(\w+(?::\w+)?)=(\S*)", text))

    def wait(self, job_id: int, states: set[str], timeout: float, log: Path | None = None) -> dict[str, str]:
        """Poll the job until its state is one of ``states``.

        Raises:
            TimeoutError: not in time; the job is cancelled (the next test would queue behind it)
                and the message holds its record and the end of ``log``.
        """
        deadline = time.monotonic() + timeout
        job = self.job(job_id)
        while job["JobState"] not in states:
            if time.monotonic() > deadline:
                self.cancel(job_id)
                tail = log.read_text()[-4000:] if log and log.exists() else ""
                raise TimeoutError(f"job {job_id} still {job['JobState']} after {timeout} s: {job}\n{tail}")
            time.sleep(0.5)
            job = self.job(job_id)
        return job

    def cancel(self, job_id: int) -> None:
        self.command("scancel", str(job_id), check=False)
