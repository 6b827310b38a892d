"""The reference trainer's save retry (chaos.reference.save_retry): backoff, give-up, and no retry of a
save that already entered a collective. Events go to a real CHAOS_EVENTS file; sleeping is recorded, not done."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from chaos.reference.save_retry import Backoff, save_with_retry


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[dict[str, Any]]]:
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("CHAOS_EVENTS", str(path))
    return lambda: [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def failing(times: int, code: int = errno.EIO, *, after_collective: bool = False) -> Callable[..., str]:
    calls = {"n": 0}

    def save(*, collective: Callable[[], AbstractContextManager[None]]) -> str:
        calls["n"] += 1
        if after_collective:
            with collective():
                pass
        if calls["n"] <= times:
            raise OSError(code, "injected")
        return "saved"

    return save


def test_transient_errors_are_retried_with_growing_delays(events: Callable[[], list[dict[str, Any]]]) -> None:
    slept: list[float] = []
    assert save_with_retry(failing(3), step=20, rank=1, sleep=slept.append) == "saved"
    assert slept == [0.2, 0.4, 0.8]
    got = events()
    assert [e["kind"] for e in got] == ["target.checkpoint_retry"] * 3
    assert [
        (e["data"]["attempt"], e["data"]["errno_name"], e["data"]["delay_s"], e["data"]["step"], e["rank"]) for e in got
    ] == [
        (1, "EIO", 0.2, 20, 1),
        (2, "EIO", 0.4, 20, 1),
        (3, "EIO", 0.8, 20, 1),
    ]


def test_the_delay_is_capped_and_the_job_gives_up_after_max_attempts(
    events: Callable[[], list[dict[str, Any]]],
) -> None:
    slept: list[float] = []
    policy = Backoff(base_s=1.0, factor=3.0, cap_s=4.0, max_attempts=4)
    with pytest.raises(OSError) as raised:
        save_with_retry(failing(10, errno.ENOSPC), step=30, rank=0, policy=policy, sleep=slept.append)
    assert raised.value.errno == errno.ENOSPC
    assert slept == [1.0, 3.0, 4.0]
    assert events()[-1]["kind"] == "target.checkpoint_failed" and events()[-1]["data"]["attempts"] == 4


@pytest.mark.parametrize("case", ["not transient", "after a collective"])
def test_no_retry_when_it_cannot_help_or_would_desync(case: str, events: Callable[[], list[dict[str, Any]]]) -> None:
    save = failing(1, errno.EACCES) if case == "not transient" else failing(1, after_collective=True)
    with pytest.raises(OSError):
        save_with_retry(save, step=10, rank=0, sleep=lambda _: pytest.fail("slept"))
    [failed] = events()
    assert failed["kind"] == "target.checkpoint_failed" and failed["data"]["attempts"] == 1
