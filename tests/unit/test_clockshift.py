"""The clock shim (native/clockshift.c), compiled here and preloaded into a real Python: the wall clock follows the
offset files the harness writes (injectors.clock.shim), for this process's scopes only, adding up; the monotonic
clock, sleeps and timed waits do not move; an absolute CLOCK_REALTIME sleep ends when the shifted clock reaches
its deadline; a removed, empty or unparseable file means no offset; and mlchaos's own event stamps stay on the
machine's clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from capabilities import requires
from support import ROOT

from chaos.events import ENV_CLOCK_DIR
from injectors.clock import shim

pytestmark = requires("gcc")

HOUR_NS = 3600 * 10**9

# Runs under the shim with RANK=3 and CHAOS_REPLICA=a. ``skew()``: how far time.time() is from the wall clock this process had at start
# moved on by its monotonic clock, i.e. the offset in force (a small error, never minutes).
CHILD = r"""
import ctypes, datetime, json, os, sys, threading, time
from pathlib import Path
from chaos import events
from injectors.clock import shim

folder = Path(os.environ["MLCHAOS_CLOCK_DIR"])
WALL0, MONO0 = time.time(), time.monotonic()
def skew():
    return time.time() - (WALL0 + time.monotonic() - MONO0)
def settle():
    time.sleep(0.15)  # the shim reads the folder again every 50 ms
seen = {}
everyone = shim.offset_file(folder, "all", "op#1")
shim.write_offset(everyone, 3600 * 10**9)
settle()
seen["all"] = skew()
seen["datetime"] = datetime.datetime.now().timestamp() - (WALL0 + time.monotonic() - MONO0)
seen["events"] = events._now_ns() / 1e9 - (WALL0 + time.monotonic() - MONO0)
seen["monotonic"] = time.monotonic() - MONO0
t = time.monotonic(); time.sleep(0.2); seen["sleep"] = time.monotonic() - t
t = time.monotonic(); threading.Event().wait(0.2); seen["wait"] = time.monotonic() - t
libc = ctypes.CDLL(None)
deadline = (ctypes.c_int64 * 2)(int(time.time()), 0)  # the shifted wall clock's next second or so
deadline[0] += 1
t = time.monotonic(); rc = libc.clock_nanosleep(0, 1, deadline, None); seen["abstime_sleep"] = time.monotonic() - t
seen["abstime_rc"] = rc
shim.write_offset(shim.offset_file(folder, "rank-3", "op#2"), -60 * 10**9)
shim.write_offset(shim.offset_file(folder, "rank-7", "op#3"), 7 * 10**9)  # another rank's: not ours
shim.write_offset(shim.offset_file(folder, "replica-b", "op#4"), 5 * 10**9)  # another replica's: not ours
shim.write_offset(shim.offset_file(folder, "replica-a", "op#5"), 2 * 10**9)
settle()
seen["sum"] = skew()
shim.remove_offset(everyone)
settle()
seen["rank_and_replica"] = skew()
shim.remove_offset(shim.offset_file(folder, "rank-3", "op#2"))
shim.remove_offset(shim.offset_file(folder, "replica-a", "op#5"))
(folder / "all@garbage").write_text("12 o'clock")
(folder / "all@empty").write_text("")
settle()
seen["healed"] = skew()
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = tmp_path_factory.mktemp("clockshift") / "clockshift.so"
    source = ROOT / "native" / "clockshift.c"
    cc = ["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", str(built), str(source), "-ldl"]
    done = subprocess.run(cc, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return built


def test_the_wall_clock_follows_the_offset_files_of_its_scopes_and_nothing_else_moves(
    library: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "LD_PRELOAD": str(library), ENV_CLOCK_DIR: str(tmp_path / "clock"), "RANK": "3"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["CHAOS_REPLICA"] = "a"
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert abs(seen["all"] - 3600) < 1 and abs(seen["datetime"] - 3600) < 1, seen
    assert abs(seen["events"]) < 1, "mlchaos's event stamps must stay on the machine's clock"
    assert seen["monotonic"] < 30, "the monotonic clock jumped with the wall clock"
    assert 0.15 < seen["sleep"] < 5 and 0.15 < seen["wait"] < 5, seen
    assert seen["abstime_rc"] == 0 and seen["abstime_sleep"] < 5, "an absolute wall-clock sleep waited the offset"
    assert abs(seen["sum"] - 3542) < 1, "all (+1h), rank-3 (-60s), replica-a (+2s) add up; rank-7, replica-b: not ours"
    assert abs(seen["rank_and_replica"] + 58) < 1, seen
    assert abs(seen["healed"]) < 1, "a removed, empty or unparseable file means no offset"


def test_a_process_without_the_folder_runs_on_the_true_clock(library: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV_CLOCK_DIR}
    code = "import time, datetime; print(time.time(), datetime.datetime.now().timestamp())"
    env["LD_PRELOAD"] = str(library)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert all(abs(float(value) - time.time()) < 30 for value in done.stdout.split()), done.stdout


def test_offset_files_are_named_by_scope_and_a_safe_op_id() -> None:
    folder = Path("/run/x/clock")
    assert shim.offset_file(folder, "rank-1", "jump#1").name.startswith("rank-1@jump_1-")
    assert shim.offset_file(folder, "all", "a#1") != shim.offset_file(folder, "all", "a_1")
    assert shim.scope_of(2, None) == "rank-2" and shim.scope_of(None, "trainer.0") == "replica-trainer.0"
    assert shim.scope_of(None, None) == "all"
