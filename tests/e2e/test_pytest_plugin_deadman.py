"""``chaos_inject`` faults without a duration still get a dead-man switch: renewed while the test process lives,
fired once it is SIGKILLed (every fault has a dead-man switch)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# The child shortens the open window to 4 s (+ 5 s grace): renewal must keep the rule for well over one window.
CHILD = textwrap.dedent(
    """
    import sys, time
    from chaos.pytest_plugin import inject
    inject.OPEN_WINDOW_S = 4.0
    chaos = inject.ChaosInject("deadman-open")
    params = {"peers": ["127.0.0.1"], "ports": [int(sys.argv[1])], "direction": "both", "protocol": "tcp"}
    with chaos.fault("partition", params) as applied:  # no duration
        print("CHAINS " + " ".join(spec["chain"] for spec in applied.state["chains"]), flush=True)
        time.sleep(600)
    """
)


def _rules() -> str:
    return subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout


def _wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.5)
    return False


def test_durationless_fault_is_renewed_while_alive_and_reverted_after_sigkill(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("iptables-save") is None:
        pytest.skip("needs root and iptables")
    env = dict(os.environ, MLCHAOS_STATE_DIR=str(tmp_path / "state"))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "47123"], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("CHAINS "), line
        chains = line.split()[1:]
        assert chains and all(chain in _rules() for chain in chains)
        # Past one whole window (4 s + 5 s grace) the rule is still there: the switch was pushed on, not fired.
        time.sleep(14)
        assert child.poll() is None
        assert all(chain in _rules() for chain in chains), "the dead-man fired while the test process was alive"
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        assert all(chain in _rules() for chain in chains), "the rule went with the process: nothing to prove"
        assert _wait_for(lambda: not any(chain in _rules() for chain in chains), timeout=30), (
            "the duration-less partition outlived its SIGKILLed test process by 30 s"
        )
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        subprocess.run(
            [str(Path(sys.executable).parent / "mlchaos"), "cleanup"], env=env, capture_output=True, check=False
        )
