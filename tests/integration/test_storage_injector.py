"""storage: a real FUSE layer mounted over a temporary directory (no mocks but for check()'s probes).

Every test heals in ``finally`` and the autouse fixture fails the test if a ``chaos-fuse`` mount is left.
Skips with the reason when this host cannot mount FUSE (no /dev/fuse, no fusermount3, no mfusepy, not root).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import ValidationError
from support import wait_for

from chaos.cluster.local import LocalTransport
from chaos.plugins import registry
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError, Unsupported
from injectors.process.faults import ProcessHost
from injectors.storage import fuselayer
from injectors.storage import injector as storage
from injectors.storage.injector import StorageInjector, StorageParams


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "FUSE tests mount with allow_other and need root"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    return fuselayer.binding_problem()


def _chaos_mounts() -> list[fuselayer.Mount]:
    with open("/proc/self/mounts", encoding="utf-8") as handle:
        return fuselayer.chaos_mounts(handle.read())


@pytest.fixture(autouse=True)
def _fuse_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("MLCHAOS_STATE_DIR", str(tmp_path / "state"))
    before = _chaos_mounts()
    yield
    left = [m for m in _chaos_mounts() if m not in before and m.target.startswith(str(tmp_path))]  # ours only
    for mount in left:  # do not leak into the next test, then fail this one
        subprocess.run(fuselayer.unmount_argv(mount.target, lazy=True), check=False)
    assert not left, f"chaos-fuse mounts left behind: {left}"


def _skip_without_fuse() -> None:
    if reason := _unavailable():
        pytest.skip(reason)


def _op(path: Path, duration: float = 60.0, **params: Any) -> FaultOp:
    return FaultOp(
        op_id=f"storage-{uuid.uuid4().hex[:8]}",
        fault="disk",
        injector="storage",
        params=StorageParams(path=str(path), **params),
        duration_s=duration,
    )


@contextmanager
def layer(path: Path, **params: Any) -> Iterator[tuple[StorageInjector, InjectionContext, Applied]]:
    """Apply a storage fault over ``path`` and heal it however the body ends."""
    _skip_without_fuse()
    injector, ctx = StorageInjector(), InjectionContext(transport=LocalTransport())
    op = _op(path, **params)
    injector.check(ctx, op.params)
    applied = injector.prepare(ctx, op)
    try:
        injector.apply(ctx, applied)
        yield injector, ctx, applied
    finally:
        injector.heal(ctx, applied)


def _mounted(path: Path) -> bool:
    return any(m.target == str(path) for m in _chaos_mounts())


def _daemons(ctx: InjectionContext, applied: Applied) -> list[int]:
    return storage._daemons(ProcessHost(ctx.transport), applied)


def _errno_of(action: Callable[[], object]) -> int | None:
    try:
        action()
    except OSError as exc:
        return exc.errno
    return None


def _write_fsync(path: Path, data: bytes) -> float:
    start = time.monotonic()
    with open(path, "wb", buffering=0) as handle:  # unbuffered: one write(2), then fsync(2)
        handle.write(data)
        os.fsync(handle.fileno())
    return time.monotonic() - start


# -- parameters and capability probe (no mount) ---------------------------------------------------------------


def test_params_are_validated() -> None:
    assert set(get_args(storage.Op)) == set(fuselayer.OPS)
    assert StorageParams(path="/ckpt/").path == "/ckpt"
    mounts = "chaos-fuse:a /tmp/x\\040y fuse.chaos-fuse rw 0 0\n"
    assert fuselayer.parse_mounts(mounts) == [fuselayer.Mount("chaos-fuse:a", "/tmp/x y", "fuse.chaos-fuse")]
    assert fuselayer.is_mounted("chaos-fuse:a", "/tmp/x y", mounts)
    assert StorageParams(path="/ckpt", mode="fsync_stall").effective_ops() == ("fsync",)
    for bad in (
        {"path": "ckpt"},
        {"path": "/"},
        {"path": "/ckpt", "mode": "eio", "latency": "1s"},
        {"path": "/ckpt", "mode": "readonly", "ops": ["read"]},
        {"path": "/ckpt", "ops": []},
        {"path": "/ckpt", "ops": ["chmodd"]},
        {"path": "/ckpt", "probability": 0},
    ):
        with pytest.raises(ValidationError):
            StorageParams.model_validate(bad)


def test_check_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, params = InjectionContext(transport=LocalTransport()), StorageParams(path="/ckpt")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(Unsupported, match="fusermount3"):
        StorageInjector().check(ctx, params)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(fuselayer, "binding_problem", lambda: "the Python package mfusepy is not installed")
    with pytest.raises(Unsupported, match="mfusepy"):
        StorageInjector().check(ctx, params)


def test_registered() -> None:
    assert registry.injectors()["storage"] is StorageInjector


# -- real mounts ------------------------------------------------------------------------------------------------


def test_writes_through_the_layer_are_in_the_real_directory_after_heal(tmp_path: Path) -> None:
    ckpt = tmp_path / "check points"  # a space: /proc/mounts escapes it as \040
    ckpt.mkdir()
    (ckpt / "old.pt").write_bytes(b"old")
    with layer(ckpt, latency="10ms", ops=["write"]) as (_, _, applied):
        assert _mounted(ckpt)
        assert (ckpt / "old.pt").read_bytes() == b"old"  # the layer shows what was there
        (ckpt / "step-1").mkdir()
        (ckpt / "step-1" / "tmp.pt").write_bytes(b"weights" * 1000)
        os.rename(ckpt / "step-1" / "tmp.pt", ckpt / "step-1" / "model.pt")
        (ckpt / "old.pt").unlink()
        assert applied.state["helper_pid"]
        state_files = [Path(str(applied.state[key])) for key in ("control", "status", "log")]
        assert all(f.exists() for f in state_files)
    assert not _mounted(ckpt)
    assert not [f for f in state_files if f.exists()]  # the heal took its control, status and log files along
    assert (ckpt / "step-1" / "model.pt").read_bytes() == b"weights" * 1000
    assert not (ckpt / "old.pt").exists()
    assert sorted(p.name for p in ckpt.rglob("*")) == ["model.pt", "step-1"]  # no .fuse_hidden leftovers


def test_latency_slows_write_and_fsync(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with layer(ckpt, mode="latency", latency="300ms", ops=["write", "fsync"]):
        baseline = _write_fsync(tmp_path / "plain.bin", b"x" * 4096)
        slowed = _write_fsync(ckpt / "slow.bin", b"x" * 4096)
    assert slowed >= 0.5, f"write+fsync took {slowed:.3f}s under 2 x 300ms of latency"
    assert slowed > baseline + 0.4
    assert (ckpt / "slow.bin").stat().st_size == 4096


@pytest.mark.parametrize(("mode", "code"), [("eio", errno.EIO), ("enospc", errno.ENOSPC), ("readonly", errno.EROFS)])
def test_error_modes(tmp_path: Path, mode: str, code: int) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(b"model")
    with layer(ckpt, mode="latency", latency="1ms", ops=["fsync"]) as (_, ctx, applied):
        fd = os.open(ckpt / "model.pt", os.O_WRONLY)  # opened through the layer before the fault
        try:
            storage.change(ctx, applied, StorageParams(path=str(ckpt), mode=mode))
            assert _errno_of(lambda: os.write(fd, b"more")) == code
            assert _errno_of(lambda: os.open(ckpt / "new.pt", os.O_WRONLY | os.O_CREAT, 0o644)) == code
            assert _errno_of(lambda: os.mkdir(ckpt / "step-2")) == code
            if mode == "eio":
                assert _errno_of(lambda: (ckpt / "model.pt").read_bytes()) == errno.EIO
            else:  # reading is fine on a full or read-only disk
                assert (ckpt / "model.pt").read_bytes() == b"model"
            if mode == "readonly":
                assert _errno_of(lambda: os.open(ckpt / "model.pt", os.O_WRONLY)) == errno.EROFS
                assert _errno_of(lambda: (ckpt / "model.pt").unlink()) == errno.EROFS
            if mode == "enospc":
                assert os.statvfs(ckpt).f_bavail == 0
        finally:
            # Before heal: an fd held across heal keeps the daemon for the drain. close() may report the
            # injected error of its flush (eio), like a network filesystem would; the fd is released anyway.
            assert _errno_of(lambda: os.close(fd)) in (None, code)
    assert (ckpt / "model.pt").read_bytes() == b"model"
    assert not (ckpt / "new.pt").exists()


def test_hang_blocks_a_reader_until_heal(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(b"model")
    got: list[bytes] = []
    with layer(ckpt, mode="hang", ops=["read"]) as (injector, ctx, applied):
        reader = threading.Thread(target=lambda: got.append((ckpt / "model.pt").read_bytes()), daemon=True)
        reader.start()
        time.sleep(0.7)
        assert reader.is_alive() and not got, "the read should hang while the fault is on"
        start = time.monotonic()
        injector.heal(ctx, applied)
        reader.join(timeout=10)
        assert not reader.is_alive()
        assert got == [b"model"]
        assert time.monotonic() - start < 8


def test_a_save_into_hung_storage_is_reported_by_the_save_watchdog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storage every rank writes to hangs (a shared filesystem): no rank waits in a collective, so no
    process-group timeout can fire; the reference trainer's save watchdog reports detect.checkpoint_stall
    from the blocked rank, once, and the save completes after heal."""
    import json

    import torch.distributed as dist

    from chaos.reference import checkpoint_store

    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("CHAOS_EVENTS", str(events))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        done: list[Path] = []
        with layer(ckpt, mode="hang") as (injector, ctx, applied):
            saver = threading.Thread(
                target=lambda: done.append(
                    checkpoint_store.save(ckpt, 10, {"w": 1}, rank=0, world_size=1, attempt=0, stall_after=0.5)[0]
                ),
                daemon=True,
            )
            saver.start()
            assert wait_for(lambda: events.exists() and "detect.checkpoint_stall" in events.read_text(), 15)
            assert saver.is_alive() and not done, "the save should still hang"
            injector.heal(ctx, applied)
            saver.join(timeout=20)
        assert done == [ckpt / "ckpt-000010"] and checkpoint_store.committed_steps(ckpt) == [10]
        kinds = [json.loads(line)["kind"] for line in events.read_text().splitlines()]
        assert kinds.count("detect.checkpoint_stall") == 1 and kinds[-1] == "target.checkpoint"
        stall = next(json.loads(line) for line in events.read_text().splitlines() if "checkpoint_stall" in line)
        assert stall["rank"] == 0 and stall["data"]["step"] == 10 and stall["data"]["phase"] == "write"
        assert stall["data"]["elapsed_s"] >= 0.5
    finally:
        dist.destroy_process_group()


def test_fault_changes_live(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "a").write_bytes(b"a")
    with layer(ckpt, mode="latency", latency="10ms", ops=["open"]) as (_, ctx, applied):
        assert (ckpt / "a").read_bytes() == b"a"
        storage.change(ctx, applied, StorageParams(path=str(ckpt), mode="eio", ops=["open"]))
        assert _errno_of(lambda: (ckpt / "a").read_bytes()) == errno.EIO
        storage.change(ctx, applied, None)
        assert (ckpt / "a").read_bytes() == b"a"
        with pytest.raises(InjectionError, match="mounted on"):
            storage.change(ctx, applied, StorageParams(path="/elsewhere", mode="eio"))


_HOLDER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"before\\n")
print("open", flush=True)
sys.stdin.readline()
try:
    os.write(fd, b"after\\n")
    print("write ok", flush=True)
except OSError as exc:
    print(f"write errno {exc.errno}", flush=True)
try:
    os.close(fd)
    print("closed", flush=True)
except OSError as exc:
    print(f"close errno {exc.errno}", flush=True)
try:
    os.fstat(fd)
    print("fd still open", flush=True)
except OSError:
    print("fd released", flush=True)
"""


@contextmanager
def holder(path: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process holding ``path`` open for writing until told to go on."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _go_on(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate("go\n", timeout=20)
    assert proc.returncode == 0, out
    return out


def test_heal_with_a_file_held_open_keeps_it_working_through_the_drain(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with layer(ckpt, mode="hang", ops=["fsync"], drain="20s") as (injector, ctx, applied):
        with holder(ckpt / "held.pt") as proc:
            healer = threading.Thread(target=injector.heal, args=(ctx, applied), daemon=True)
            start = time.monotonic()
            healer.start()
            assert wait_for(lambda: not _mounted(ckpt), timeout=10), "heal should detach the busy mount lazily"
            assert _go_on(proc) == "write ok\nclosed\nfd released\n"  # the layer still serves the open file
            healer.join(timeout=15)
            assert not healer.is_alive()
            assert time.monotonic() - start < 10, "the daemon should leave when the last open file closes"
    assert (ckpt / "held.pt").read_bytes() == b"before\nafter\n"


def test_heal_with_a_file_held_open_past_the_drain(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with layer(ckpt, mode="eio", ops=["fsync"], drain="500ms") as (injector, ctx, applied):
        with holder(ckpt / "held.pt") as proc:
            injector.heal(ctx, applied)  # returns once the daemon is gone, after the drain
            assert not _mounted(ckpt)
            pid = applied.state["helper_pid"]
            assert isinstance(pid, int) and not _daemons(ctx, applied)
            out = _go_on(proc)  # I/O and close() report ENOTCONN, but close() releases the fd as always
            assert out == f"write errno {errno.ENOTCONN}\nclose errno {errno.ENOTCONN}\nfd released\n"
    assert (ckpt / "held.pt").read_bytes() == b"before\n"  # what was written before the heal is kept


def test_heal_is_idempotent_and_works_from_the_journal_alone(tmp_path: Path) -> None:
    _skip_without_fuse()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ctx = InjectionContext(transport=LocalTransport())
    first = StorageInjector()
    applied = first.prepare(ctx, _op(ckpt, mode="eio"))
    try:
        first.apply(ctx, applied)
        assert _mounted(ckpt)
        journaled = Applied.model_validate_json(applied.model_dump_json())
        del journaled.state["helper_pid"]  # as if the harness died before journaling the daemon's pid
        StorageInjector().heal(InjectionContext(transport=LocalTransport()), journaled)
        assert not _mounted(ckpt)
        assert not _daemons(ctx, journaled)
        StorageInjector().heal(ctx, journaled)  # twice is fine
    finally:
        first.heal(ctx, applied)  # and a third time, with the original record
    (ckpt / "after").write_bytes(b"ok")  # the real directory again


def test_revert_command_alone_ends_the_fault(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(b"model")
    with layer(ckpt, mode="eio", drain="200ms") as (injector, ctx, applied):
        argv = injector.revert_command(applied)
        assert argv == ["fusermount3", "-uz", str(ckpt)]
        subprocess.run(argv, check=True)  # what the dead-man runs when the harness is gone
        assert not _mounted(ckpt)
        assert wait_for(lambda: not _daemons(ctx, applied), timeout=10)
        assert (ckpt / "model.pt").read_bytes() == b"model"


def test_prepare_refuses_a_second_layer_on_the_same_path(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with layer(ckpt, mode="eio", ops=["fsync"]) as (injector, ctx, _):
        with pytest.raises(InjectionError, match="already mounted"):
            injector.prepare(ctx, _op(ckpt, mode="hang"))
    with pytest.raises(InjectionError, match="not a directory"):
        StorageInjector().prepare(InjectionContext(transport=LocalTransport()), _op(tmp_path / "missing"))


def test_container_paths_map_through_the_innermost_bind_mount() -> None:
    from injectors.storage.injector import host_path_of

    mounts = [
        {"Type": "bind", "Source": "/srv/data", "Destination": "/data", "Propagation": "rslave"},
        {"Type": "bind", "Source": "/fast/ckpt", "Destination": "/data/ckpt", "Propagation": "rprivate"},
        {"Type": "volume", "Source": "/var/lib/docker/volumes/v/_data", "Destination": "/vol"},
    ]
    assert host_path_of(mounts, "/data/x/y") == ("/srv/data/x/y", {**mounts[0]})
    path, mount = host_path_of(mounts, "/data/ckpt/step-1") or ("", {})
    assert path == "/fast/ckpt/step-1" and mount["Propagation"] == "rprivate"
    assert host_path_of(mounts, "/data") == ("/srv/data", {**mounts[0]})
    assert host_path_of(mounts, "/vol/a") is None  # a named volume is not a bind the host can stall
    assert host_path_of(mounts, "/dataset") is None  # prefix of a name is not a parent directory


def test_mountinfo_parsing_finds_shared_mount_points() -> None:
    from chaos.testbed.shared_mounts import mount_points

    text = (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "43 27 254:0 /tmp /tmp rw,relatime shared:2 - ext4 /dev/vda rw\n"
        "50 27 0:50 / /mnt/with\\040space rw master:3 - tmpfs none rw\n"
    )
    assert mount_points(text) == {"/": False, "/tmp": True, "/mnt/with space": False}
