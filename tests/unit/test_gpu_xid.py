"""gpu_xid: a real-format XID line appended to a log on the fault's host; heal (or the dead-man's argv alone)
removes exactly the lines the op added. Runs the real sh/awk scripts on this machine."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaos.cluster.local import LocalTransport
from chaos.plugins import registry
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError
from chaos.slurm import healthcheck_probes as probes
from chaos.slurm.healthcheck_xid import NODE_FATAL, scan
from injectors.gpu_xid import GpuXidInjector, GpuXidParams, XidState, kernel_line

OTHER = "Nov 24 10:00:00 h2 kernel: [   12.000000] e1000e: eth0 NIC Link is Up\n"


def _op(log: Path | str, code: int = 79, **params: object) -> FaultOp:
    return FaultOp(
        op_id=f"xid-{uuid.uuid4().hex[:6]}",
        fault="xid",
        injector="gpu_xid",
        params=GpuXidParams(code=code, log=str(log), **params),
    )


def _applied(log: Path, code: int = 79, **params: object) -> tuple[InjectionContext, Applied]:
    ctx = InjectionContext(transport=LocalTransport())
    injector = GpuXidInjector()
    op = _op(log, code, **params)
    injector.check(ctx, op.params)
    return ctx, injector.prepare(ctx, op)


def test_registered_and_params_validated() -> None:
    assert registry.injectors()["gpu_xid"] is GpuXidInjector
    for bad in ({"code": 13}, {"code": 79, "log": "relative.log"}, {"code": 79, "log": "/a/../etc/passwd"}):
        with pytest.raises(ValidationError):
            GpuXidParams.model_validate(bad)
    with pytest.raises(ValidationError):
        GpuXidParams(code=79, log="/x; rm -rf /")
    with pytest.raises(ValidationError):
        GpuXidParams(code=79, name="a b")


def test_the_line_is_in_kernel_log_format() -> None:
    line = kernel_line("NVRM: Xid (PCI:0000:3b:00): 79, x", host="h2", uptime=8123.4567891, when=0)
    assert line.endswith(" h2 kernel: [ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, x")


def test_apply_appends_one_line_the_health_check_reads_and_heal_removes_exactly_it(tmp_path: Path) -> None:
    log = tmp_path / "xid" / "{host}.log"
    real = tmp_path / "xid" / "local.log"
    real.parent.mkdir()
    real.write_text(OTHER)
    ctx, applied = _applied(log, 119, pid=4242, name="torchrun")
    assert applied.state["log"] == str(real) and applied.host == "local"
    injector = GpuXidInjector()
    injector.apply(ctx, applied)
    text = real.read_text()
    [added] = text[len(OTHER) :].splitlines()
    assert " kernel: [" in added and "NVRM: Xid (PCI:0000:3b:00): 119, pid=4242, name=torchrun, Timeout after" in added
    assert [x.code for x in scan(text)] == [119]
    assert not probes.xid([real], NODE_FATAL).ok
    real.write_text(real.read_text() + OTHER)  # the log goes on after the fault
    injector.heal(ctx, applied)
    assert real.read_text() == OTHER + OTHER
    assert probes.xid([real], NODE_FATAL).ok
    injector.heal(ctx, applied)  # idempotent
    assert real.read_text() == OTHER + OTHER


def test_the_dead_man_argv_alone_reverts_and_creates_no_file(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    ctx, applied = _applied(log)
    argv = GpuXidInjector().revert_command(applied)
    assert argv is not None
    assert subprocess.run(argv, check=False).returncode == 0 and not log.exists()  # nothing applied yet
    GpuXidInjector().apply(ctx, applied)
    assert log.read_text().count("NVRM: Xid") == 1
    journaled = Applied.model_validate_json(applied.model_dump_json())
    assert subprocess.run(GpuXidInjector().revert_command(journaled) or [], check=False).returncode == 0
    assert log.read_text() == ""


def test_two_ops_on_one_log_heal_independently(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    ctx, first = _applied(log, 79)
    _, second = _applied(log, 145)
    GpuXidInjector().apply(ctx, first)
    GpuXidInjector().apply(ctx, second)
    GpuXidInjector().heal(ctx, first)
    assert [x.code for x in scan(log.read_text())] == [145]
    GpuXidInjector().heal(ctx, second)
    assert log.read_text() == ""


def test_a_journal_edit_cannot_aim_heal_elsewhere() -> None:
    with pytest.raises(InjectionError):
        XidState.from_json({"log": "relative", "lines": ["x"]})
    with pytest.raises(InjectionError):
        XidState.from_json({"log": "/var/log/{host}.log", "lines": ["x"]})
