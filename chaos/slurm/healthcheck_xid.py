"""NVIDIA XID lines: the codes the field notes name, what each calls for, and reading them from a kernel log.

The GPU driver (``NVRM``) reports a GPU error as one kernel-log line, e.g. (``/var/log/kern.log``, syslog form)::

    Nov 24 10:11:12 gpu07 kernel: [ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.

``dmesg`` prints the same without the syslog prefix (``[ 8123.456789] NVRM: Xid ...``) and ``journalctl -k``
with its own. :func:`scan` finds the XID lines in any of these forms.

The table (:data:`XIDS`) is the seed's (``FIELD-NOTES.md``, Lablup, "XID actions table"): 79 needs a reboot;
119, 145 and 149 a GPU reset; 31 and 43 restarting the application; 94 is a contained ECC error. The codes
whose action needs the node taken out of service (reboot, GPU reset) are :data:`NODE_FATAL`: the health check
drains a node that logged one. The messages are representative of what the driver prints for each code (they
vary by driver release); only the ``NVRM: Xid (PCI:...): <code>,`` head is what readers key on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Action = Literal["reboot", "gpu_reset", "restart_app", "none"]


@dataclass(frozen=True)
class XidInfo:
    code: int
    action: Action  # what the seed's table says to do
    message: str  # the text after "pid=..., name=..., " in the driver's line


XIDS: dict[int, XidInfo] = {
    info.code: info
    for info in (
        XidInfo(31, "restart_app", "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS faulted @ 0x7f12_34560000"),
        XidInfo(43, "restart_app", "channel 0x00000010"),
        XidInfo(79, "reboot", "GPU has fallen off the bus."),
        XidInfo(94, "none", "Contained: SM (0x1). RST: No, D-RST: No"),
        XidInfo(119, "gpu_reset", "Timeout after 6s of waiting for RPC response from GPU0 GSP!"),
        XidInfo(145, "gpu_reset", "NVLink: RLW error, link down"),
        XidInfo(149, "gpu_reset", "NVLink: NETIR error, link down"),
    )
}
NODE_FATAL: tuple[int, ...] = tuple(code for code, info in XIDS.items() if info.action in ("reboot", "gpu_reset"))
"""XID codes whose action (reboot, GPU reset) takes the node out of service: 79, 119, 145, 149."""

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..." (older drivers: "NVRM: Xid (0000:3b:00): 79, ...")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+)(?:, (?P<rest>.*))?$")
_UPTIME = re.compile(r"\[\s*(?P<secs>\d+\.\d+)\]")
_BOOT = "Linux version "  # the kernel's first line after a boot


@dataclass(frozen=True)
class XidLine:
    code: int
    pci: str
    text: str  # the whole line
    lineno: int  # 1-based, in the file read

    @property
    def detail(self) -> str:
        """``79 on PCI:0000:3b:00 (GPU has fallen off the bus.)`` (the driver's text, without pid/name)."""
        info = XIDS.get(self.code)
        about = f" ({info.message})" if info is not None else ""
        return f"{self.code} on PCI:{self.pci}{about}"


def xid_line(code: int, *, pci: str = "0000:3b:00", pid: int | str = "'<unknown>'", name: str = "python3") -> str:
    """The driver's message for ``code`` (no timestamp prefix): ``NVRM: Xid (PCI:...): 79, pid=..., ...``."""
    info = XIDS.get(code)
    if info is None:
        raise ValueError(f"XID {code} is not in the table (known: {', '.join(str(c) for c in XIDS)})")
    return f"NVRM: Xid (PCI:{pci}): {code}, pid={pid}, name={name}, {info.message}"


def scan(text: str) -> list[XidLine]:
    """Every XID line of a kernel log since its last boot (a ``Linux version`` banner, or the kernel's uptime
    stamp going backwards, starts a new boot: what an earlier boot logged was cleared by that reboot)."""
    found: list[XidLine] = []
    last_uptime = -1.0
    for lineno, line in enumerate(text.splitlines(), start=1):
        stamp = _UPTIME.search(line)
        uptime = float(stamp.group("secs")) if stamp is not None else None
        if _BOOT in line or (uptime is not None and uptime < last_uptime):
            found.clear()
        if uptime is not None:
            last_uptime = uptime
        match = _XID.search(line)
        if match is not None:
            found.append(XidLine(int(match.group("code")), match.group("pci"), line, lineno))
    return found
