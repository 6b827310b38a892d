"""The node health check Slurm runs (``HealthCheckProgram``), the loop of seed 000: every ``HealthCheckInterval``
each slurmd runs it; a node that fails drains ITSELF, so no new job (and no requeued attempt) lands on it.

Run it as ``python3 -m chaos.slurm.healthcheck --config FILE`` (``--dry-run``: report, touch nothing).
slurmd runs the program with no arguments and an almost empty environment (only ``SLURMD_NODENAME`` and
``PWD``: no ``PATH``, no ``SLURM_CONF``), so give Slurm the program :func:`write_program` writes (``python3 -m
chaos.slurm.healthcheck --write-program PATH --config FILE``): a Python script whose ``#!`` line names
this interpreter and which passes the config itself; ``path`` and ``slurm_conf`` of the config are the
environment ``scontrol`` gets. The config is read on every run, so changing it needs no restart.

What it checks (:mod:`chaos.slurm.healthcheck_probes`), in this order; a section set to null is off:
``xid`` (a node-fatal XID in the kernel log), ``storage`` (the checkpoint directory answers within a bound),
``peers`` (enough slurmd peers accept TCP), ``memory`` (MemAvailable floor), ``cpu`` (no job process under a CFS
quota below a floor). ``{node}`` in a path is the node's name.

On a failure it drains its node: ``scontrol update nodename=<node> state=drain reason="mlchaos-hc: <check>
<detail>"`` (the first failed check names the reason), unless the node is already drained (an operator's
reason is never overwritten). A node that passes is never touched, except that with ``resume: true`` a node
whose drain reason is the health check's own (``mlchaos-hc:``) and that passes again is resumed. Default: it
stays drained (seed 000: a node that failed is taken out until someone looks at it).
Exit status: 0 healthy, 1 unhealthy, 2 the check itself could not run (bad config, scontrol failed).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from chaos.slurm import healthcheck_probes as probes
from chaos.slurm.client import parse_node
from chaos.slurm.healthcheck_xid import NODE_FATAL
from chaos.spec.units import Duration

MODULE = "chaos.slurm.healthcheck"
REASON_PREFIX = "mlchaos-hc: "
_REASON_MAX = 200  # Slurm keeps longer reasons, but they stop being readable in sinfo/scontrol
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # holds chaos/
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class XidCheck(_Section):
    logs: list[str] = Field(
        default_factory=lambda: ["/var/log/kern.log"],
        description="kernel logs to scan (syslog kern.log, a dmesg capture, or the log gpu_xid writes)",
    )
    fatal: list[int] = Field(default_factory=lambda: list(NODE_FATAL), description="XID codes that drain the node")


class StorageCheck(_Section):
    path: str = Field(description="the checkpoint directory on this node")
    timeout: Duration = Field(default=5.0, gt=0, description="the bound on stat + write + fsync + read + unlink")


class PeersCheck(_Section):
    addresses: list[str] | None = Field(
        default=None, description="peers as name=address:port; null: every other node of slurm_conf"
    )
    timeout: Duration = Field(default=2.0, gt=0, description="TCP connect timeout per peer")
    min_reachable: float = Field(default=0.5, ge=0, le=1, description="share of peers that must accept")


class MemoryCheck(_Section):
    min_available_mb: int = Field(default=256, ge=0)


class CpuCheck(_Section):
    min_cpus: float = Field(default=0.5, gt=0, description="smallest CFS quota (CPUs) a job process may run under")


class HealthCheckConfig(BaseModel):
    """The health check's YAML config (every path may hold ``{node}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str | None = Field(default=None, description="null: $SLURMD_NODENAME, else this host's name")
    slurm_conf: str | None = Field(default=None, description="SLURM_CONF for scontrol (and the peer list)")
    path: str = Field(default=DEFAULT_PATH, description="PATH for scontrol")
    scontrol: str = "scontrol"
    resume: bool = Field(default=False, description="resume a node this check drained once it passes again")
    log: str | None = Field(default=None, description="append one line per run here")
    xid: XidCheck | None = Field(default_factory=XidCheck)
    storage: StorageCheck | None = None
    peers: PeersCheck | None = Field(default_factory=PeersCheck)
    memory: MemoryCheck | None = Field(default_factory=MemoryCheck)
    cpu: CpuCheck | None = Field(default_factory=CpuCheck)


def load_config(path: Path) -> HealthCheckConfig:
    """The config at ``path`` (YAML or JSON); ValueError naming the file and the problem."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        return HealthCheckConfig.model_validate(raw)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"health check config {path}: {exc}") from None


def node_name(config: HealthCheckConfig) -> str:
    return config.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _at(template: str, node: str) -> Path:
    return Path(template.replace("{node}", node))


def _peer_list(config: HealthCheckConfig, section: PeersCheck, node: str) -> list[probes.Peer]:
    if section.addresses is not None:
        found = []
        for item in section.addresses:
            name, _, where = item.rpartition("=")
            host, _, port = where.rpartition(":")
            found.append(probes.Peer(name or where, host or where, int(port) if port.isdigit() else probes.SLURMD_PORT))
        return [peer for peer in found if peer.name != node]
    if config.slurm_conf is None:
        return []
    return probes.peers_from_conf(Path(config.slurm_conf).read_text(), node)


def run_probes(config: HealthCheckConfig, node: str) -> list[probes.Finding]:
    """Every enabled probe's finding, in the module docstring's order (all run, so the log shows them all)."""
    found: list[probes.Finding] = []
    if config.xid is not None:
        found.append(probes.xid([_at(log, node) for log in config.xid.logs], config.xid.fatal))
    if config.storage is not None:
        found.append(probes.storage(_at(config.storage.path, node), config.storage.timeout, node))
    if config.peers is not None:
        try:
            peer_list = _peer_list(config, config.peers, node)
        except (OSError, ValueError) as exc:
            found.append(probes.Finding("peers", False, f"cannot list peers: {exc}"))
        else:
            found.append(probes.peers(peer_list, config.peers.timeout, config.peers.min_reachable))
    if config.memory is not None:
        found.append(probes.memory(config.memory.min_available_mb))
    if config.cpu is not None:
        found.append(probes.cpu(config.cpu.min_cpus))
    return found


def drain_reason(finding: probes.Finding) -> str:
    """``mlchaos-hc: <check> <detail>`` on one line, cut to a readable length."""
    text = f"{REASON_PREFIX}{finding.check} {finding.detail}".replace("\n", " ")
    return text[:_REASON_MAX]


Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


class Scontrol:
    """``scontrol`` with the config's PATH and SLURM_CONF (slurmd gives the program neither)."""

    def __init__(self, config: HealthCheckConfig, runner: Runner | None = None) -> None:
        self.env = {"PATH": config.path, **({"SLURM_CONF": config.slurm_conf} if config.slurm_conf else {})}
        self.binary = config.scontrol
        self._runner = runner or self._run

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, env={**os.environ, **self.env})

    def __call__(self, *args: str) -> str:
        done = self._runner([self.binary, *args])
        if done.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {(done.stderr or done.stdout).strip()[:300]}")
        return done.stdout

    def node_state(self, node: str) -> tuple[bool, str | None]:
        """(drained, reason) of ``node``."""
        lines = [line for line in self("-o", "show", "node", node).splitlines() if line.startswith("NodeName=")]
        if not lines:
            raise RuntimeError(f"scontrol printed no node {node}")
        found = parse_node(lines[0])
        return found.drained, found.reason


def act(config: HealthCheckConfig, node: str, found: Sequence[probes.Finding], scontrol: Scontrol) -> str:
    """Drain on a failure (unless already drained), resume when configured; what was done, in words."""
    failed = [finding for finding in found if not finding.ok]
    if failed:
        drained, reason = scontrol.node_state(node)
        if drained:
            return f"already drained ({reason})"
        text = drain_reason(failed[0])
        scontrol("update", f"nodename={node}", "state=drain", f"reason={text}")
        return f"drained: {text}"
    if config.resume:
        drained, reason = scontrol.node_state(node)
        if drained and (reason or "").startswith(REASON_PREFIX):
            scontrol("update", f"nodename={node}", "state=resume")
            return f"resumed (was: {reason})"
    return "healthy"


def _log(config: HealthCheckConfig, node: str, line: str) -> None:
    if config.log is None:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
    try:
        with open(_at(config.log, node), "a", encoding="utf-8") as handle:
            handle.write(f"{stamp} {node} {' '.join(line.split())}\n")
    except OSError:
        pass  # the log is a convenience; the drain is what counts


def check_node(config: HealthCheckConfig, *, dry_run: bool = False, scontrol: Scontrol | None = None) -> int:
    """One run: probe, act, log. Exit status as in the module docstring."""
    node = node_name(config)
    started = time.monotonic()
    found = run_probes(config, node)
    summary = "; ".join(f"{f.check} {'ok' if f.ok else 'FAIL'}: {f.detail}" for f in found)
    failed = any(not finding.ok for finding in found)
    try:
        outcome = "dry run" if dry_run else act(config, node, found, scontrol or Scontrol(config))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        _log(config, node, f"ERROR {exc} | {summary}")
        print(f"mlchaos-hc {node}: {exc}", file=sys.stderr)
        return 2
    took = time.monotonic() - started
    _log(config, node, f"{outcome} in {took:.2f}s | {summary}")
    print(f"mlchaos-hc {node}: {outcome} | {summary}")
    return 1 if failed else 0


def write_program(program: Path, config: Path, *, python: str | None = None) -> Path:
    """Write the program slurmd runs: a Python script (``#!`` this interpreter) that runs the check with
    ``config``; no shell, no environment needed. Returns ``program``."""
    interpreter = python or sys.executable
    if " " in interpreter or len(interpreter) > 120:
        raise ValueError(f"interpreter {interpreter!r} cannot go on a #! line (spaces, or over 120 characters)")
    source = (
        f"#!{interpreter}\n"
        "# The mlchaos node health check, written by chaos.slurm.healthcheck.write_program.\n"
        "import sys\n"
        f"sys.path.insert(0, {str(_PACKAGE_ROOT)!r})\n"
        f"from {MODULE} import main\n"
        f"sys.exit(main(['--config', {str(config.resolve())!r}]))\n"
    )
    program.write_text(source)
    program.chmod(0o755)
    return program


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python3 -m {MODULE}", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the health check's YAML config")
    parser.add_argument("--dry-run", action="store_true", help="probe and report; never drain or resume")
    parser.add_argument("--write-program", type=Path, default=None, help="write the HealthCheckProgram here, exit")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)  # a broken config is refused before a program is written for it
        if args.write_program is not None:
            print(write_program(args.write_program, args.config))
            return 0
    except ValueError as exc:
        print(f"mlchaos-hc: {exc}", file=sys.stderr)
        return 2
    return check_node(config, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
