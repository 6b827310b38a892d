"""storage: the path filter (``files``) and the layer's own evidence (``storage.hit`` events at heal), on a real
FUSE mount over a temporary directory, plus the transient error window as a job's write()/fsync() sees it.

Skips with the reason when this host cannot mount FUSE (as ``test_storage_injector`` does).
"""

from __future__ import annotations

import errno
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_storage_injector import _chaos_mounts, _errno_of, _skip_without_fuse

from chaos.cluster.local import LocalTransport
from chaos.history.timeline import Event, History
from chaos.plugins.injector import Applied, FaultOp, InjectionContext
from injectors.storage import fuselayer
from injectors.storage.hits import STORAGE_HIT, HitCounter, matches, parse_hits
from injectors.storage.injector import StorageInjector, StorageParams


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("MLCHAOS_STATE_DIR", str(tmp_path / "state"))
    before = _chaos_mounts()
    yield
    ours = [m for m in _chaos_mounts() if m not in before and m.target.startswith(str(tmp_path))]
    assert ours == [], "chaos-fuse mounts left behind"


@contextmanager
def layer(path: Path, history: History, **params: Any) -> Iterator[tuple[InjectionContext, Applied]]:
    _skip_without_fuse()
    injector, ctx = StorageInjector(), InjectionContext(transport=LocalTransport(), history=history)
    op = FaultOp(
        op_id=f"disk-{uuid.uuid4().hex[:6]}@local",
        fault="disk",
        injector="storage",
        params=StorageParams(path=str(path), **params),
        duration_s=60.0,
    )
    applied = injector.prepare(ctx, op)
    try:
        injector.apply(ctx, applied)
        yield ctx, applied
    finally:
        injector.heal(ctx, applied)


def _timed_read(path: Path) -> float:
    start = time.monotonic()
    path.read_bytes()
    return time.monotonic() - start


def _hits(history: History) -> list[Event]:
    return history.of(STORAGE_HIT)


def test_globs_select_paths_relative_to_the_mount() -> None:
    assert matches("step-20/rank-2.pt", ("step-*/rank-2*",))
    assert matches("/step-20/rank-2.pt", ("./step-*/rank-2*",))
    assert not matches("step-20/rank-1.pt", ("step-*/rank-2*",))
    assert matches("a/b/rank-2.pt", ("rank-2*",))  # no slash: the file name in any directory
    assert not matches("rank-2/x.pt", ("rank-2",))
    assert matches("anything", ())
    for bad in ("", "/", "../up", "a/../../b"):
        with pytest.raises(ValueError, match="files"):
            StorageParams(path="/ckpt", files=bad)
    assert StorageParams(path="/ckpt", files="step-*/rank-2*").files == ("step-*/rank-2*",)


def test_hit_counter_keeps_exact_counts_past_its_time_cap() -> None:
    counter = HitCounter()
    for i in range(1000):
        counter.add("create", "step-10/rank-0.pt", "EIO", at_ns=1_000 + i)
    [hit] = parse_hits(counter.snapshot().decode())
    assert (hit.count, hit.first_ns, hit.last_ns, hit.errno_name) == (1000, 1_000, 1_999, "EIO")
    assert 0 < len(hit.times_ns) < 1000
    assert parse_hits('{"hits": [{"op": 1}]}') == [] and parse_hits("not json") == []


def test_read_latency_on_one_ranks_files_only_and_the_evidence_names_them(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "step-10").mkdir(parents=True)
    for rank in (0, 1, 2):
        (ckpt / "step-10" / f"rank-{rank}.pt").write_bytes(b"w" * 20_000)
    history = History()
    with layer(ckpt, history, mode="latency", latency="400ms", ops=["read"], files="step-*/rank-2*") as (ctx, applied):
        assert _timed_read(ckpt / "step-10" / "rank-0.pt") < 0.3  # another rank's file: untouched
        assert _timed_read(ckpt / "step-10" / "rank-2.pt") >= 0.35  # this rank's file: every read waits
        began = time.monotonic()
        (ckpt / "step-10" / "rank-2.new").write_bytes(b"x")  # writes are not in ops
        (ckpt / "step-10" / "rank-2.new").unlink()
        assert time.monotonic() - began < 0.3
        assert "rank-2*" in applied.description
    hits = _hits(history)
    assert hits, "heal recorded no storage.hit although reads were delayed"
    assert {(e.get_str("op"), e.get_str("path"), e.data.get("errno_name")) for e in hits} == {
        ("read", "step-10/rank-2.pt", None)
    }
    [hit] = hits
    assert hit.data["mode"] == "latency" and hit.data["fault"] == "disk" and hit.source == "injector"
    assert hit.get_str("op_id") == applied.op_id.removesuffix("@local") and hit.get_str("mount") == str(ckpt)
    assert (hit.get_int("count") or 0) >= 1 and float(hit.data["latency_s"]) >= 0.35  # type: ignore[arg-type]
    assert not list((tmp_path / "state").rglob("*.hits.json")), "heal left the hits file behind"
    StorageInjector().heal(ctx, applied)  # heal is idempotent: a second one records nothing more
    assert _hits(history) == hits


@pytest.mark.parametrize(("mode", "code"), [("eio", errno.EIO), ("enospc", errno.ENOSPC)])
def test_an_error_window_reaches_a_jobs_write_and_fsync_and_is_counted(tmp_path: Path, mode: str, code: int) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    history = History()
    name = errno.errorcode[code]
    with layer(ckpt, history, mode=mode, ops=["write", "fsync"]):
        fd = os.open(ckpt / "part.pt", os.O_WRONLY | os.O_CREAT, 0o644)  # create is not hit: write and fsync are
        try:
            assert _errno_of(lambda: os.write(fd, b"weights")) == code
            assert _errno_of(lambda: os.write(fd, b"weights")) == code
            assert _errno_of(lambda: os.fsync(fd)) == code
        finally:
            assert _errno_of(lambda: os.close(fd)) in (None, code)
    # The window is over: the same save now succeeds, in the real directory.
    (ckpt / "part.pt").write_bytes(b"weights")
    fd = os.open(ckpt / "part.pt", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    assert (ckpt / "part.pt").read_bytes() == b"weights"
    got = {(e.get_str("op"), e.data.get("errno_name")): e for e in _hits(history)}
    assert set(got) == {("write", name), ("fsync", name)}, got
    assert got[("write", name)].get_int("count") == 2 and got[("fsync", name)].get_int("count") == 1
    write = got[("write", name)]
    times = write.data["times_ns"]
    assert isinstance(times, list) and len(times) == 2 and write.get_int("first_ns") == times[0]
    assert write.get_int("last_ns") == times[1] and write.ts_ns == times[0]


def test_the_daemon_rejects_a_malformed_files_list() -> None:
    with pytest.raises(ValueError, match="files"):
        fuselayer.Fault.from_json(b'{"mode": "eio", "ops": ["read"], "generation": 1, "files": [""]}')
    fault = fuselayer.Fault.from_json(fuselayer.Fault(mode="eio", generation=2, files=("a/*",)).to_json())
    assert fault.files == ("a/*",)
