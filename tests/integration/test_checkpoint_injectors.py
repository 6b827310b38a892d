"""The ``checkpoint_*`` faults on real files, against the reference trainer's checkpoint store (in-process, two
simulated ranks that verify their own files and agree through a real MIN over threads), and the torn-write
watcher against a real writer process it kills mid-file."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from chaos.cluster.local import LocalTransport
from chaos.history.timeline import History
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError
from chaos.plugins.registry import injector
from chaos.reference import checkpoint_store as store

WORLD = 2


def _save(directory: Path, step: int) -> None:
    parts = [
        store.write_part(directory, step, rank, {"step": step, "w": torch.full((64,), float(step + rank))})
        for rank in range(WORLD)
    ]
    store.commit(directory, step, parts, WORLD)


class _Min:
    """An all-reduce MIN over threads, one per simulated rank."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world)
        self.values: dict[int, int] = {}

    def of(self, rank: int) -> Any:
        def reduce(value: int) -> int:
            self.values[rank] = value
            self.barrier.wait()
            result = min(self.values.values())
            self.barrier.wait()
            return result

        return reduce


def restore_all(directory: Path) -> dict[int, tuple[int, Path, dict[str, Any]] | None]:
    """Every simulated rank's restore, run concurrently as the ranks of a job would."""
    reducer, found = _Min(WORLD), {}

    def one(rank: int) -> None:
        found[rank] = store.restore(directory, rank=rank, world_size=WORLD, attempt=1, reduce_min=reducer.of(rank))

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(WORLD)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return found


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("CHAOS_EVENTS", str(path))
    yield path


def _events(path: Path, kind: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["kind"] == kind]


@pytest.fixture
def ckpt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLCHAOS_STATE_DIR", str(tmp_path / "state"))
    directory = tmp_path / "ckpt"
    for step in (10, 20, 30):
        _save(directory, step)
    return directory


def _fire(
    name: str, params: dict[str, Any], history: History, target: object = None, duration: float | None = None
) -> tuple[Any, InjectionContext, Applied]:
    inj = injector(name)
    ctx = InjectionContext(LocalTransport(), history=history, target=target)
    op = FaultOp(
        op_id=f"{name}#1", fault=name, injector=name, params=inj.Params.model_validate(params), duration_s=duration
    )
    inj.check(ctx, op.params)
    applied = inj.prepare(ctx, op)
    inj.apply(ctx, applied)
    return inj, ctx, applied


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_corrupt_is_rejected_by_its_rank_every_rank_falls_back_and_heal_restores(ckpt: Path, events: Path) -> None:
    history = History()
    history.record("target.checkpoint", step=30, path=str(store.step_dir(ckpt, 30)))
    newest = store.step_dir(ckpt, 30) / "rank-1.pt"
    os.utime(newest)  # the newest file by mtime is the one hit
    original = _sha(newest)
    inj, ctx, applied = _fire("checkpoint_corrupt", {"path": str(ckpt), "files": "rank-1.pt", "bytes": 8}, history)
    assert _sha(newest) != original
    [damage] = history.of("fault.checkpoint")
    assert damage.data["path"] == str(newest) and damage.get_int("step") == 30 and len(damage.data["offsets"]) == 8  # type: ignore[arg-type]

    found = restore_all(ckpt)
    assert {rank: r[0] for rank, r in found.items() if r} == {0: 20, 1: 20}  # rank 0's own file was fine: it follows
    [rejected] = _events(events, "target.checkpoint_rejected")
    assert rejected["rank"] == 1 and rejected["data"]["step"] == 30 and "sha256" in rejected["data"]["reason"]
    resumes = _events(events, "target.resume")
    assert {(e["rank"], e["data"]["step"], e["data"]["verified"]) for e in resumes} == {(0, 20, True), (1, 20, True)}
    assert all(e["data"]["rejected"] == [30] for e in resumes)
    assert {e["rank"] for e in _events(events, "target.restore")} == {0, 1}

    inj.heal(ctx, applied)
    inj.heal(ctx, applied)  # idempotent
    assert _sha(newest) == original


def test_drop_shard_falls_back_and_heal_puts_the_file_back(ckpt: Path, events: Path) -> None:
    history = History()
    inj, ctx, applied = _fire("checkpoint_drop_shard", {"path": str(ckpt), "files": "ckpt-*/rank-0.pt"}, history)
    dropped = Path(str(applied.state["path"]))
    assert not dropped.exists() and dropped.name == "rank-0.pt"
    step = store.step_of_dir(dropped.parent)
    found = restore_all(ckpt)
    assert found[0] is not None and found[1] is not None and found[0][0] == found[1][0] < (step or 0)
    assert any("missing" in e["data"]["reason"] for e in _events(events, "target.checkpoint_rejected"))
    inj.heal(ctx, applied)
    assert dropped.exists()


def test_a_stale_pointer_is_not_trusted_and_heal_puts_it_back(ckpt: Path, events: Path) -> None:
    history = History()
    inj, ctx, applied = _fire("checkpoint_stale_pointer", {"path": str(ckpt)}, history)
    assert store.read_pointer(ckpt) == 40
    stale = store.step_dir(ckpt, 40)
    assert stale.is_dir() and not (stale / store.MANIFEST).exists()  # a checkpoint that never completed
    assert 0 < (stale / "rank-0.pt").stat().st_size < (store.step_dir(ckpt, 30) / "rank-0.pt").stat().st_size
    found = restore_all(ckpt)
    assert {rank: r[0] for rank, r in found.items() if r} == {0: 30, 1: 30}
    rejected = _events(events, "target.checkpoint_rejected")
    assert rejected and all(e["data"]["step"] == 40 and "pointer" in e["data"]["reason"] for e in rejected)
    [damage] = history.of("fault.checkpoint")
    assert damage.data["checkpoint"] == str(stale) and damage.data["current_step"] is None
    inj.heal(ctx, applied)
    assert store.read_pointer(ckpt) == 30 and not stale.exists()


def test_a_checkpoint_fault_is_refused_when_the_target_has_no_checkpoint_dir(tmp_path: Path) -> None:
    for name in ("checkpoint_corrupt", "checkpoint_drop_shard", "checkpoint_stale_pointer"):
        with pytest.raises(InjectionError, match="no checkpoint dir"):
            _fire(name, {"path": str(tmp_path / "nothing-here")}, History())
    assert not (tmp_path / "nothing-here").exists()
    (tmp_path / "no-pointer").mkdir()
    with pytest.raises(InjectionError, match="keeps no 'latest' pointer"):
        _fire("checkpoint_stale_pointer", {"path": str(tmp_path / "no-pointer")}, History())
    assert list((tmp_path / "no-pointer").iterdir()) == []  # refused before anything changed


WRITER = """
import os, sys, time
d, chunk = sys.argv[1], 8192
data = bytes(range(256)) * 200  # 51200 bytes
while True:
    with open(os.path.join(d, "latest.pt"), "wb") as f:
        for i in range(0, len(data), chunk):
            f.write(data[i:i + chunk]); f.flush()
    time.sleep(0.2)
"""


class _Ranks:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def pids_for_rank(self, rank: int) -> list[int]:
        return [self.pid] if rank == 0 else []

    def ranks(self) -> list[int]:
        return [0]


def test_torn_write_kills_a_real_writer_mid_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLCHAOS_STATE_DIR", str(tmp_path / "state"))
    directory = tmp_path / "ckpt"
    directory.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(directory)])
    try:
        deadline = time.monotonic() + 20
        while not ((directory / "latest.pt").exists() and (directory / "latest.pt").stat().st_size == 51200):
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.05)
        history = History()
        params = {"path": str(directory), "rank": 0, "fraction": 0.5}
        inj, ctx, applied = _fire("checkpoint_torn_write", params, history, _Ranks(writer.pid), duration=15.0)
        assert writer.wait(timeout=20) == -signal.SIGKILL
        inj.heal(ctx, applied)
        inj.heal(ctx, applied)
        [torn] = history.of("fault.checkpoint")
        size = (directory / "latest.pt").stat().st_size
        assert torn.data["mode"] == "torn_write" and torn.get_int("at_bytes") == 25600
        assert 25600 <= size < 51200 and size % 8192 == 0 and torn.get_int("size") == size  # cut between two writes
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(timeout=10)
