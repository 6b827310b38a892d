"""A small, typed client of a Slurm cluster's own commands, run as argv lists through a Transport.

Where the commands run is the transport's business: :class:`~chaos.cluster.local.LocalTransport` for the
testbed (whose ``slurm.conf`` is not at the default path: pass ``conf``, and every command becomes
``env SLURM_CONF=<conf> <command>``), or :class:`~chaos.cluster.ssh.SshTransport` to a login node of an
existing cluster (:func:`login_client`), where the commands find their own configuration.

Output formats are the text ones that have been stable for many Slurm releases (``scontrol -o`` key=value
lines, ``sacct --parsable2``, ``sbatch --parsable``), not ``--json``, whose schema changes with every release
and which ``scontrol`` in 22.05 (Debian 12) does not have. Every failure is a :class:`SlurmError` naming the
command, its exit code and Slurm's own message; an unknown job id is a :class:`JobNotFound`.

Accounting: a cluster with slurmdbd answers ``sacct`` from its database; the testbed has no database and
keeps the job-completion log (``JobCompType=jobcomp/filetxt``), which ``sacct --completion`` reads: pass
``completion_log=True`` (the testbed's :meth:`~chaos.testbed.slurm.SlurmTestbed.client` does).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from chaos.cluster.base import Completed, TransportError

if TYPE_CHECKING:
    from chaos.cluster.inventory import Inventory

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-\[\],]*$")  # a node name or a hostlist expression
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
# `scontrol -o` prints "Key=value Key2=value 2 ..."; a key starts a word and may hold ':' and '/' ("CPUs/Task").
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/.]*)=")
# A node's reason ends with "[user@time]"; it may hold spaces and '=' of its own.
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)\s*\[[^\]\s]*@[^\]\s]*\](?=\s|$)")
_NO_TIME = {"", "None", "Unknown", "N/A", "(null)"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "Submit", "Start", "End")


class CommandRunner(Protocol):
    """All the client needs of a :class:`~chaos.cluster.base.Transport` (any transport is one)."""

    host: str

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed: ...


class SlurmError(RuntimeError):
    """A Slurm command failed (or could not run at all); the message names it and quotes Slurm."""

    def __init__(
        self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None, stderr: str = ""
    ) -> None:
        super().__init__(message)
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr


class JobNotFound(SlurmError):
    """The controller does not know the job (never submitted, or aged out of its memory: see ``MinJobAge``)."""


@dataclass(frozen=True)
class Job:
    """One job as the controller sees it (``scontrol -o show job``)."""

    job_id: int
    name: str
    state: str  # Slurm's base state: PENDING, RUNNING, COMPLETED, FAILED, NODE_FAIL, REQUEUED, CANCELLED, ...
    reason: str  # why it is pending or how it ended ("None" when there is nothing to say)
    nodes: tuple[str, ...]  # the allocation, expanded (empty while pending)
    batch_host: str | None  # the node that runs the batch script
    exit_code: int | None
    exit_signal: int | None
    restarts: int  # how often it was requeued
    requeue: bool  # whether it may be requeued
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    fields: Mapping[str, str] = field(default_factory=dict, repr=False)  # every key=value, as Slurm wrote it


@dataclass(frozen=True)
class QueuedJob:
    """One line of ``squeue``: a job the controller still holds."""

    job_id: int
    state: str
    nodes: tuple[str, ...]
    reason: str
    name: str


@dataclass(frozen=True)
class Node:
    """One node as the controller sees it (``scontrol -o show node``)."""

    name: str
    address: str
    state: str  # the base state: IDLE, ALLOCATED, MIXED, DOWN, UNKNOWN, FUTURE, ...
    flags: frozenset[str]  # DRAIN, NOT_RESPONDING, COMPLETING, REBOOT_REQUESTED, ...
    reason: str | None  # the operator's / health check's reason, without Slurm's "[user@time]" suffix
    fields: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def drained(self) -> bool:
        """DRAIN is set: no new job lands here (running ones finish: "draining" until then)."""
        return "DRAIN" in self.flags

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags and self.state not in ("DOWN", "UNKNOWN")

    @property
    def available(self) -> bool:
        """Up, responding, not drained: the scheduler may place a job here."""
        return self.responding and not self.drained and self.state in ("IDLE", "MIXED", "ALLOCATED")


@dataclass(frozen=True)
class AccountingRecord:
    """One line of ``sacct --parsable2``: a job (``"7"``) or, with slurmdbd, one of its steps (``"7.0"``)."""

    job_id: str
    name: str
    state: str  # first word only ("CANCELLED by 0" -> CANCELLED)
    exit_code: int | None
    exit_signal: int | None
    nodes: tuple[str, ...]
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None


class SlurmClient:
    """Slurm's commands on the transport's host, with typed results.

    ``conf``: a ``slurm.conf`` path on that host (None: the host's default). ``completion_log``: read
    accounting from the job-completion log (``sacct --completion``) instead of slurmdbd.
    """

    def __init__(
        self, transport: CommandRunner, *, conf: str | None = None, completion_log: bool = False, timeout: float = 30.0
    ) -> None:
        self.transport = transport
        self.conf = conf
        self.completion_log = completion_log
        self.timeout = timeout

    # --- plumbing ------------------------------------------------------------------------------------------

    def argv(self, command: list[str], env: Mapping[str, str] | None = None) -> list[str]:
        """``command`` as it runs on the host: under ``env SLURM_CONF=... [NAME=value ...]`` when :attr:`conf`
        or ``env`` is set (sbatch exports its environment to the job: that is how ``env`` reaches it)."""
        words = [f"SLURM_CONF={self.conf}"] if self.conf is not None else []
        for name, value in (env or {}).items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r}: letters, digits and '_' only")
            words.append(f"{name}={value}")
        return ["env", *words, *command] if words else command

    def _run(self, command: list[str], env: Mapping[str, str] | None = None) -> Completed:
        try:
            done = self.transport.run(self.argv(command, env), timeout=self.timeout)
        except TransportError as exc:
            raise SlurmError(f"{command[0]} could not run on {self.transport.host}: {exc}", argv=command) from exc
        if done.returncode == 127:  # env's or the login shell's "command not found"
            raise SlurmError(
                f"{command[0]} is not installed on {self.transport.host} (Debian: slurm-client): {done.stderr.strip()}",
                argv=command,
                returncode=done.returncode,
                stderr=done.stderr,
            )
        if not done.ok:
            message = done.stderr.strip() or done.stdout.strip() or "no message"
            kind = JobNotFound if "Invalid job id" in message else SlurmError
            raise kind(
                f"{' '.join(command)} failed ({done.returncode}) on {self.transport.host}: {message[:500]}",
                argv=command,
                returncode=done.returncode,
                stderr=done.stderr,
            )
        return done

    # --- jobs ----------------------------------------------------------------------------------------------

    def submit(
        self,
        script: str | Path,
        *,
        nodes: int | None = None,
        ntasks_per_node: int | None = None,
        job_name: str | None = None,
        output: str | Path | None = None,
        chdir: str | Path | None = None,
        requeue: bool | None = None,
        partition: str | None = None,
        extra: Sequence[str] = (),
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> int:
        """``sbatch --parsable`` the script at ``script`` (a path on the host) with ``args``; the new job's id.

        ``extra`` are further sbatch options, each one argv word (``["--time=5", "--exclusive"]``); ``env`` is
        set for sbatch, which exports it (with the rest of its environment) to the job."""
        argv = ["sbatch", "--parsable"]
        if nodes is not None:
            argv.append(f"--nodes={_positive(nodes, 'nodes')}")
        if ntasks_per_node is not None:
            argv.append(f"--ntasks-per-node={_positive(ntasks_per_node, 'ntasks_per_node')}")
        if job_name is not None:
            if not _JOB_NAME.match(job_name):
                raise ValueError(f"job name {job_name!r}: letters, digits, '_', '.', '-' only")
            argv.append(f"--job-name={job_name}")
        if partition is not None:
            argv.append(f"--partition={_checked_name(partition)}")
        if output is not None:
            argv.append(f"--output={output}")
        if chdir is not None:
            argv.append(f"--chdir={chdir}")
        if requeue is not None:
            argv.append("--requeue" if requeue else "--no-requeue")
        for word in extra:
            if not word.startswith("-"):
                raise ValueError(f"extra sbatch argument {word!r} is not an option (the script comes last)")
            argv.append(word)
        argv.append(str(script))
        argv.extend(args)
        out = self._run(argv, env).stdout.strip()
        first = out.splitlines()[-1].split(";")[0] if out else ""  # "<id>" or "<id>;<cluster>"
        if not first.isdigit():
            raise SlurmError(f"sbatch printed no job id: {out[:200]!r}", argv=argv)
        return int(first)

    def job(self, job_id: int) -> Job:
        """The controller's view of ``job_id``; :class:`JobNotFound` when it has none (see ``sacct``)."""
        out = self._run(["scontrol", "-o", "show", "job", str(int(job_id))]).stdout
        jobs = [parse_job(line) for line in out.splitlines() if line.startswith("JobId=")]
        if not jobs:
            raise JobNotFound(f"scontrol printed no job {job_id}: {out[:200]!r}", argv=["scontrol", "show", "job"])
        return jobs[0]

    def queue(self, *, all_states: bool = True) -> list[QueuedJob]:
        """``squeue``: every job the controller holds (``all_states``: finished ones too, until MinJobAge)."""
        argv = ["squeue", "--noheader", "--format=%i|%T|%N|%r|%j"]
        if all_states:
            argv.append("--states=all")
        out = self._run(argv).stdout
        jobs = []
        for line in out.splitlines():
            parts = line.split("|", 4)
            if len(parts) == 5 and parts[0].strip().isdigit():
                job_id, state, nodes, reason, name = (p.strip() for p in parts)
                jobs.append(QueuedJob(int(job_id), state, tuple(expand_hostlist(nodes)), reason, name))
        return jobs

    def cancel(self, job_id: int) -> None:
        """``scancel`` the job (its every attempt)."""
        self._run(["scancel", str(int(job_id))])

    def accounting(self, job_id: int) -> list[AccountingRecord]:
        """``sacct --parsable2`` lines of ``job_id`` (from the completion log when :attr:`completion_log`)."""
        argv = ["sacct", "--parsable2", "--noheader", f"--jobs={int(job_id)}", "--format=" + ",".join(_SACCT_FIELDS)]
        if self.completion_log:
            argv.insert(1, "--completion")
        else:
            argv.insert(1, "--duplicates")  # every attempt of a requeued job, not just the last
        out = self._run(argv).stdout
        return [parse_accounting(line) for line in out.splitlines() if line.strip()]

    # --- nodes ---------------------------------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        """Every node of the cluster."""
        out = self._run(["scontrol", "-o", "show", "node"]).stdout
        return [parse_node(line) for line in out.splitlines() if line.startswith("NodeName=")]

    def node(self, name: str) -> Node:
        out = self._run(["scontrol", "-o", "show", "node", _checked_name(name)]).stdout
        found = [parse_node(line) for line in out.splitlines() if line.startswith("NodeName=")]
        if not found:
            raise SlurmError(f"scontrol printed no node {name}: {out[:200]!r}")
        return found[0]

    def partition_nodes(self, partition: str | None = None) -> list[str]:
        """The node names of ``partition`` (None: the default partition), expanded."""
        argv = ["scontrol", "-o", "show", "partition"]
        if partition is not None:
            argv.append(_checked_name(partition))
        out = self._run(argv).stdout
        for line in out.splitlines():
            fields = parse_fields(line)
            if "PartitionName" not in fields:
                continue
            if partition is None and fields.get("Default") != "YES":
                continue
            return expand_hostlist(fields.get("Nodes", ""))
        raise SlurmError(f"no partition {partition or '(default)'} on {self.transport.host}: {out[:200]!r}", argv=argv)

    def drain(self, node: str, reason: str) -> None:
        """Set DRAIN on ``node`` with ``reason`` (Slurm requires one): what an operator or a health check does."""
        self._update_node(node, "drain", reason)

    def resume(self, node: str) -> None:
        """Clear DRAIN (and DOWN) on ``node``."""
        self._update_node(node, "resume", None)

    def set_down(self, node: str, reason: str) -> None:
        """Mark ``node`` DOWN with ``reason``: its jobs are killed (and requeued if they may be)."""
        self._update_node(node, "down", reason)

    def _update_node(self, node: str, state: str, reason: str | None) -> None:
        argv = ["scontrol", "update", f"nodename={_checked_name(node)}", f"state={state}"]
        if reason is not None:
            if not reason.strip() or "\n" in reason:
                raise ValueError(f"reason {reason!r}: one non-empty line")
            argv.append(f"reason={reason}")
        self._run(argv)


def login_client(
    inventory: Inventory, host: str, *, conf: str | None = None, completion_log: bool = False, timeout: float = 30.0
) -> SlurmClient:
    """A client whose commands run on inventory host ``host`` (an existing cluster's login node) over SSH,
    with the inventory's host-key settings."""
    from chaos.cluster.ssh import SshTransport  # paramiko only for clients that need it

    transport = SshTransport.for_host(inventory, host)
    return SlurmClient(transport, conf=conf, completion_log=completion_log, timeout=timeout)


# --- parsing (pure) ------------------------------------------------------------------------------------------


def parse_fields(line: str) -> dict[str, str]:
    """``Key=value Key2=more words ...`` (one ``scontrol -o`` line) as a dict; a value runs to the next key."""
    matches = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out.setdefault(match.group(1), line[match.end() : end].strip())
    return out


def parse_job(line: str) -> Job:
    f = parse_fields(line)
    code, sig = _exit_code(f.get("ExitCode", ""))
    batch = f.get("BatchHost", "")
    return Job(
        job_id=int(f["JobId"]),
        name=f.get("JobName", ""),
        state=f.get("JobState", "UNKNOWN"),
        reason=f.get("Reason", ""),
        nodes=tuple(expand_hostlist(f.get("NodeList", ""))),
        batch_host=batch if batch and batch != "(null)" else None,
        exit_code=code,
        exit_signal=sig,
        restarts=int(f.get("Restarts", "0") or 0),
        requeue=f.get("Requeue", "0") == "1",
        submit_time=parse_time(f.get("SubmitTime", "")),
        start_time=parse_time(f.get("StartTime", "")),
        end_time=parse_time(f.get("EndTime", "")),
        fields=f,
    )


def parse_node(line: str) -> Node:
    f = parse_fields(line)
    reason: str | None = None
    found = _REASON.search(line)
    if found is not None:
        reason = found.group(1).strip()
    elif f.get("Reason"):
        reason = f["Reason"]
    words = f.get("State", "UNKNOWN").split("+")
    base = words[0]
    flags = set(words[1:])
    if base.endswith("*"):  # older spelling of "not responding"
        base = base.rstrip("*")
        flags.add("NOT_RESPONDING")
    return Node(
        name=f["NodeName"],
        address=f.get("NodeAddr", ""),
        state=base,
        flags=frozenset(flags),
        reason=reason or None,
        fields=f,
    )


def parse_accounting(line: str) -> AccountingRecord:
    parts = line.split("|")
    if len(parts) < len(_SACCT_FIELDS):
        raise SlurmError(f"sacct line has {len(parts)} fields, not {len(_SACCT_FIELDS)}: {line[:200]!r}")
    job_id, name, state, exit_code, nodes, submit, start, end = parts[: len(_SACCT_FIELDS)]
    code, sig = _exit_code(exit_code)
    return AccountingRecord(
        job_id=job_id,
        name=name,
        state=state.split()[0] if state.strip() else "",
        exit_code=code,
        exit_signal=sig,
        nodes=tuple(expand_hostlist(nodes)) if nodes not in ("None assigned", "") else (),
        submit_time=parse_time(submit),
        start_time=parse_time(start),
        end_time=parse_time(end),
    )


def parse_time(text: str) -> datetime | None:
    """Slurm's local ``YYYY-MM-DDTHH:MM:SS`` as an aware datetime (this host's zone); None for Unknown/None/N/A."""
    text = text.strip()
    if text in _NO_TIME:
        return None
    try:
        return datetime.fromisoformat(text).astimezone()
    except ValueError:
        return None


def _exit_code(text: str) -> tuple[int | None, int | None]:
    code, _, sig = text.partition(":")
    return (int(code) if code.isdigit() else None, int(sig) if sig.isdigit() else None)


def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist expression as names: ``h[1-3,5],gpu[01-02]`` -> h1 h2 h3 h5 gpu01 gpu02.

    ``(null)``/``None assigned``/empty -> []. Zero padding is kept; several bracket groups multiply."""
    text = text.strip()
    if text in ("", "(null)", "None assigned", "None"):
        return []
    names: list[str] = []
    for item in _split_top(text):
        names.extend(_expand_one(item))
    return names


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def _expand_one(item: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.find("]", open_at)
    if close_at < 0:
        raise ValueError(f"unbalanced hostlist {item!r}")
    head, ranges, tail = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    out: list[str] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"bad range {part!r} in hostlist {item!r}")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            out.extend(head + f"{number:0{width}d}" + rest for rest in _expand_one(tail))
    return out


def _positive(value: int, what: str) -> int:
    if value < 1:
        raise ValueError(f"{what} must be at least 1, not {value}")
    return value


def _checked_name(name: str) -> str:
    if not _NODE_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid Slurm node or partition name")
    return name
