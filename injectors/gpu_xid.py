"""``gpu_xid``: an NVIDIA XID error line appended to the kernel log the node health check reads.

This EMULATES the GPU driver: there is no GPU here, and a real XID cannot be produced without one. What the
fault writes is the line the driver (``NVRM``) would print, in kernel-log (syslog ``kern.log``) form::

    Nov 24 10:11:12 h2 kernel: [ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.

with a code from the seed's XID table (:data:`chaos.slurm.healthcheck_xid.XIDS`: 31, 43, 79, 94, 119,
145, 149), to ``log`` on the fault's host (``{host}`` in the path is that host's name; default
``/var/lib/mlchaos/xid/{host}.log``). The health check (:mod:`chaos.slurm.healthcheck`, ``xid.logs``)
reads that file. On a real GPU node the same check reads what the driver writes itself: the kernel log
(``/var/log/kern.log``, ``journalctl -k``, a ``dmesg`` capture); ``nvidia-smi -q`` shows the GPU's state
(a GPU that fell off the bus is missing from it) and DCGM reports XIDs as events. Nothing here touches a GPU.

The exact lines are built at ``prepare`` and journaled, so heal (and the dead-man, with the same argv) removes
exactly those lines, once each, and nothing else the log holds; both hold an ``flock`` on the log while they
write. Heal means "the GPU was repaired": the check then passes again (whether the node is resumed is the
health check's ``resume`` setting).
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from chaos.cluster.base import read_host_file
from chaos.cluster.local import LocalTransport
from chaos.plugins.injector import (
    Applied,
    FaultOp,
    InjectionContext,
    InjectionError,
    InjectorBase,
    state_text,
    state_texts,
)
from chaos.slurm.healthcheck_xid import XIDS, xid_line
from injectors.base import probe
from injectors.hostfiles import HostFiles

DEFAULT_LOG = "/var/lib/mlchaos/xid/{host}.log"
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./+\-@%{}]*$")

APPEND_SCRIPT = r"""
f=$1; shift
mkdir -p "$(dirname "$f")" || exit 1
exec 9>>"$f" || exit 1
flock 9 2>/dev/null || true
for line in "$@"; do printf '%s\n' "$line" >&9 || exit 1; done
"""
"""``sh -c APPEND_SCRIPT mlchaos-xid LOG LINE...``: append the lines under the log's flock."""

REMOVE_SCRIPT = r"""
f=$1; shift
[ -f "$f" ] || exit 0
exec 9>>"$f" || exit 1
flock 9 2>/dev/null || true
tmp=$(mktemp "$f.mlchaos.XXXXXX") || exit 1
awk 'BEGIN { for (i = 2; i < ARGC; i++) { drop[ARGV[i]]++; delete ARGV[i] } }
     ($0 in drop) && drop[$0] > 0 { drop[$0]--; next }
     { print }' "$f" "$@" > "$tmp" && cat "$tmp" > "$f"
rc=$?
rm -f "$tmp"
exit $rc
"""
"""``sh -c REMOVE_SCRIPT mlchaos-xid-heal LOG LINE...``: drop each line once, rewrite the log in place (same
inode, so a reader holding it open sees the change), under its flock. Lines are arguments, never script."""


class GpuXidParams(BaseModel):
    """Append one XID line of ``code`` to ``log`` on the fault's host (emulating the GPU driver)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: int = Field(description=f"XID code from the seed's table: {', '.join(str(c) for c in XIDS)}")
    log: str = Field(default=DEFAULT_LOG, description="the kernel log the health check reads ({host}: the host)")
    pci: str = Field(default="0000:3b:00", pattern=r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(\.[0-7])?$")
    pid: int | None = Field(default=None, ge=1, description="the pid the line names (default: none known, 'N/A')")
    name: str = Field(default="python3", pattern=r"^[A-Za-z0-9_.:+\-]{1,32}$", description="the process name")

    @field_validator("code")
    @classmethod
    def _known(cls, value: int) -> int:
        if value not in XIDS:
            raise ValueError(f"XID {value} is not in the seed's table: {', '.join(str(c) for c in XIDS)}")
        return value

    @field_validator("log")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not _SAFE_PATH.match(value) or "/../" in f"{value}/":
            raise ValueError(f"log must be an absolute path of letters, digits and _./+-@%{{}}, got {value!r}")
        return value


@dataclass(frozen=True)
class XidState:
    """The journal state: the log on the host and the exact lines the op adds."""

    log: str
    lines: tuple[str, ...]

    def to_json(self) -> dict[str, JsonValue]:
        return {"log": self.log, "lines": list(self.lines)}

    @classmethod
    def from_json(cls, state: dict[str, JsonValue]) -> XidState:
        log, lines = state_text(state, "log"), state_texts(state, "lines")
        if not _SAFE_PATH.match(log) or "{" in log:
            raise InjectionError(f"refusing to edit {log!r}: not an absolute, expanded log path")
        return cls(log, lines)


def kernel_line(message: str, *, host: str, uptime: float, when: float) -> str:
    """``message`` as syslog writes a kernel line to kern.log: ``Mon dd HH:MM:SS host kernel: [uptime] msg``."""
    micro = round(uptime * 1e6)
    stamp = time.strftime("%b %e %H:%M:%S", time.localtime(when))
    return f"{stamp} {host} kernel: [{micro // 1_000_000:5d}.{micro % 1_000_000:06d}] {message}"


class GpuXidInjector(InjectorBase, name="gpu_xid", params=GpuXidParams):
    """append an NVIDIA XID line (emulated GPU driver) to the kernel log the health check reads

    Append a real-format XID line to the host's health-check kernel log; heal removes exactly it."""

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        argv = ["sh", "-c", "command -v awk && command -v mktemp"]
        probe(ctx.transport, argv, "cannot reach", "awk or mktemp missing on {host}", timeout=15)

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        params = op.params_as(GpuXidParams)
        host = ctx.transport.host
        shown = socket.gethostname().split(".")[0] if isinstance(ctx.transport, LocalTransport) else host
        uptime_text = read_host_file(ctx.transport, "/proc/uptime") or ""
        try:
            uptime = float(uptime_text.split()[0])
        except (IndexError, ValueError):
            raise InjectionError(f"cannot read /proc/uptime on {host}") from None
        pid: int | str = params.pid if params.pid is not None else "'N/A'"
        message = xid_line(params.code, pci=params.pci, pid=pid, name=params.name)
        line = kernel_line(message, host=shown, uptime=uptime, when=time.time())
        log = params.log.replace("{host}", host)
        state = XidState(log, (line,))
        XidState.from_json(state.to_json())  # the same refusal heal would apply, before anything is written
        return op.record(self.name, host, state.to_json(), f"XID {params.code} ({XIDS[params.code].message}) in {log}")

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        state = XidState.from_json(applied.state)
        argv = ["sh", "-c", APPEND_SCRIPT, "mlchaos-xid", state.log, *state.lines]
        HostFiles(ctx.transport).run_checked(argv, f"append to {state.log}")

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Remove exactly the op's lines (once each), then verify none is left. Idempotent."""
        state = XidState.from_json(applied.state)
        argv = _remove_argv(state)
        HostFiles(ctx.transport).run_checked(argv, f"remove the XID line(s) from {state.log}")
        left = read_host_file(ctx.transport, state.log) or ""
        present = set(left.splitlines())
        if any(line in present for line in state.lines):
            raise InjectionError(f"the XID line(s) are still in {state.log} after heal")

    def revert_command(self, applied: Applied) -> list[str] | None:
        return _remove_argv(XidState.from_json(applied.state))


def _remove_argv(state: XidState) -> list[str]:
    return ["sh", "-c", REMOVE_SCRIPT, "mlchaos-xid-heal", state.log, *state.lines]


INJECTORS = (GpuXidInjector,)
