"""The ``slurm.conf`` of the Slurm testbed (:mod:`chaos.testbed.slurm`), as text from typed settings.

Pure: no daemon, no file. What is fixed here, and why:

* ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: no cgroup plugin is needed (the hosts
  share one kernel and its cgroup v1 hierarchy; a cgroup plugin would have several slurmds fight over it).
  linuxproc tracks a job's processes by parentage, which is all a testbed job needs.
* ``SlurmdParameters=config_overrides``: every slurmd sees the same machine; the node lines are the truth.
* ``JobCompType=jobcomp/filetxt``: the accounting ``sacct --completion`` reads. Slurm 22.05 has no
  ``accounting_storage/filetxt`` (removed long ago); the only other store is slurmdbd, which needs MySQL.
* ``SlurmdSpoolDir``/``SlurmdPidFile``/``SlurmdLogFile`` carry ``%n``: each slurmd fills in its own node name,
  so one file serves every node (a per-node file would trip the controller's config-hash check).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./+\-@%]*$")  # what slurm.conf takes unquoted
PARTITION = "chaos"


class SlurmConfError(ValueError):
    """A setting the testbed cannot write into slurm.conf."""


@dataclass(frozen=True)
class SlurmSettings:
    """What a scenario or the CLI may choose about the testbed's Slurm; the rest is fixed (module doc)."""

    health_check_program: Path | None = None  # absolute; run by each slurmd (HealthCheckProgram)
    health_check_interval: int = 0  # seconds between runs; 0 = only at slurmd start
    requeue_exit: tuple[int, ...] = ()  # batch exit codes that requeue the job (RequeueExit)
    return_to_service: int = 2  # 2: a DOWN node returns when its slurmd registers again
    slurmd_timeout: int = 30  # seconds of silence before the controller marks a node DOWN
    requeue_delay: int = 10  # seconds a requeued job waits before it may start again (AuthInfo cred_expire)
    cpus: int | None = None  # CPUs each node declares (None: this machine's count; all nodes share its cores)

    def check(self) -> None:
        """SlurmConfError naming the first setting slurm.conf cannot hold."""
        if self.health_check_program is not None:
            _checked_path(self.health_check_program, "health check program")
        if self.health_check_interval < 0:
            raise SlurmConfError(f"health check interval {self.health_check_interval} < 0")
        if any(not 0 < code < 256 for code in self.requeue_exit):
            raise SlurmConfError(f"requeue exit codes {self.requeue_exit}: each in 1..255")
        if self.return_to_service not in (0, 1, 2):
            raise SlurmConfError(f"ReturnToService is 0, 1 or 2, not {self.return_to_service}")
        if self.slurmd_timeout < 5:
            raise SlurmConfError(f"slurmd timeout {self.slurmd_timeout}s is below 5s")
        if self.requeue_delay < 5:
            raise SlurmConfError(
                f"requeue delay {self.requeue_delay}s is below 5s (it is also the step credential's life)"
            )
        if self.cpus is not None and self.cpus < 1:
            raise SlurmConfError(f"cpus {self.cpus} < 1")


@dataclass(frozen=True)
class ConfPaths:
    """Where the daemons keep their files (all under the testbed's slurm folder)."""

    munge_socket: Path
    state_save: Path
    ctld_pid: Path
    ctld_log: Path
    slurmd_dir: Path  # holds <node>/ (spool), <node>.pid, <node>.log
    jobcomp: Path


def conf_text(
    *,
    cluster: str,
    controller_host: str,
    controller_address: str,
    controller_port: int,
    nodes: Sequence[tuple[str, str]],
    paths: ConfPaths,
    settings: SlurmSettings,
) -> str:
    """The slurm.conf of a testbed whose ``nodes`` are (name, address) pairs; SlurmConfError on bad input."""
    settings.check()
    cpus = settings.cpus or os.cpu_count() or 1
    for path in (*vars(paths).values(),):
        _checked_path(path, "state dir")
    if not nodes:
        raise SlurmConfError("a Slurm cluster needs at least one node")
    names = [name for name, _ in nodes]
    lines = [
        f"# {cluster}: written by chaos.testbed.slurm; removed by `mlchaos testbed down`",
        f"ClusterName={cluster}",
        f"SlurmctldHost={controller_host}({controller_address})",
        f"SlurmctldPort={controller_port}",
        "SlurmdPort=6818",  # each slurmd listens in its own network namespace
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire also holds a requeued job back (Slurm's default: 120 s, which would dwarf a test's run).
        f"AuthInfo=socket={paths.munge_socket},cred_expire={settings.requeue_delay}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={paths.state_save}",
        f"SlurmctldPidFile={paths.ctld_pid}",
        f"SlurmctldLogFile={paths.ctld_log}",
        f"SlurmdSpoolDir={paths.slurmd_dir}/%n",
        f"SlurmdPidFile={paths.slurmd_dir}/%n.pid",
        f"SlurmdLogFile={paths.slurmd_dir}/%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={paths.jobcomp}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        # A job made eligible by time (a requeued one) waits for the next pass: 60 s / 30 s by default.
        "SchedulerParameters=sched_interval=2,bf_interval=2",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SlurmdParameters=config_overrides",
        "JobRequeue=1",
        f"ReturnToService={settings.return_to_service}",
        f"SlurmdTimeout={settings.slurmd_timeout}",
        "KillWait=5",  # seconds between SIGTERM and SIGKILL of a job's steps (default 30)
        "MinJobAge=300",  # finished jobs stay in scontrol/squeue this long
        "InactiveLimit=0",
    ]
    if settings.requeue_exit:
        lines.append("RequeueExit=" + ",".join(str(code) for code in settings.requeue_exit))
    if settings.health_check_program is not None:
        lines += [
            f"HealthCheckProgram={settings.health_check_program}",
            f"HealthCheckInterval={settings.health_check_interval}",
            "HealthCheckNodeState=ANY",
        ]
    for name, address in nodes:
        lines.append(f"NodeName={name} NodeHostname={name} NodeAddr={address} CPUs={cpus} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _checked_path(path: Path, what: str) -> Path:
    if not path.is_absolute() or not _SAFE_PATH.match(str(path)):
        raise SlurmConfError(
            f"{what} path {str(path)!r} cannot go into slurm.conf: absolute, with letters, digits and _./+-@% only"
        )
    return path
