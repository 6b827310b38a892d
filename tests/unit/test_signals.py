"""Signals into exceptions (chaos.safety.signals): raised at once, or held to the end of a deferred block."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from chaos.safety.signals import signals_deferred, signals_deferred_during, signals_raise


class Stop(Exception):
    pass


def _signal_self(signum: signal.Signals) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.2)  # the handler runs between bytecodes of the main thread: let it


def test_outside_a_deferred_block_a_signal_raises_at_once() -> None:
    reached = []
    with pytest.raises(Stop, match="SIGTERM"), signals_raise(Stop):
        _signal_self(signal.SIGTERM)
        reached.append("after")
    assert reached == []


def test_inside_a_deferred_block_the_signal_waits_for_its_end_and_only_the_first_counts() -> None:
    reached = []
    with pytest.raises(Stop, match="SIGHUP"), signals_raise(Stop):
        with signals_deferred():
            _signal_self(signal.SIGHUP)
            with signals_deferred():  # nested: held until the outermost block ends
                _signal_self(signal.SIGTERM)
            reached.append("body finished")
        reached.append("after the block")
    assert reached == ["body finished"]


def test_sigint_is_held_too_and_stays_a_keyboard_interrupt() -> None:
    reached = []

    @signals_deferred_during
    def apply_and_record() -> str:
        _signal_self(signal.SIGINT)
        reached.append("recorded")
        return "done"

    with pytest.raises(KeyboardInterrupt), signals_raise(Stop):
        apply_and_record()
    assert reached == ["recorded"]


def test_the_previous_handlers_come_back_and_other_threads_install_nothing() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    with signals_raise(Stop):
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in before} == before
    seen: list[object] = []

    def in_a_thread() -> None:
        with signals_raise(Stop), signals_deferred():
            seen.append(signal.getsignal(signal.SIGTERM))

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert seen == [before[signal.SIGTERM]]
