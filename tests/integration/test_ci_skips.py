"""Under CI a capability that scripts/setup.sh provides is never skipped: a real test module run by a real pytest,
with iptables taken off PATH, fails and names iptables; without CI the same tests skip with that reason; a
kernel-dependent skip (tc netem) stays a skip under CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from capabilities import missing
from support import ROOT

NETWORK_TESTS = "tests/integration/test_network_injectors.py"


def _path_without(tmp_path: Path, prefix: str) -> str:
    """A PATH of one folder that links every program of today's PATH but those named ``prefix*``."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            target = Path(entry) / name
            if name.startswith(prefix) or (folder / name).exists() or not os.access(target, os.X_OK):
                continue
            (folder / name).symlink_to(target)
    return str(folder)


def _pytest(*args: str, ci: bool, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path, "CI": "true" if ci else ""}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rsE", *args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_without_iptables_the_network_tests_fail_under_ci_naming_it(tmp_path: Path) -> None:
    assert missing("root", "ip", "iptables", "tc") is None, "this test removes iptables from a machine that has it"
    path = _path_without(tmp_path, "iptables")
    selected = [NETWORK_TESTS, "-k", "netem_plans_are_valid_tc"]
    done = _pytest(*selected, ci=True, path=path)
    assert done.returncode == 1, done.stdout[-2000:]
    errors = re.search(r"(\d+) errors? in", done.stdout)
    assert errors and int(errors.group(1)) >= 3 and " passed" not in done.stdout, done.stdout[-2000:]
    assert "skipped under CI=true" in done.stdout and "iptables is not installed or not on PATH" in done.stdout

    # Without CI the same tests skip, with the same reason.
    done = _pytest(*selected, ci=False, path=path)
    assert done.returncode == 0 and f"{errors.group(1)} skipped" in done.stdout, done.stdout[-2000:]
    assert "iptables is not installed or not on PATH" in done.stdout


def test_a_kernel_dependent_skip_stays_a_skip_under_ci(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from capabilities import pytest_make_collect_report, pytest_runtest_makereport\n"
    )
    (tmp_path / "test_kernel.py").write_text(
        "import pytest\nfrom capabilities import kernel_lacks\n\n"
        "def test_needs_netem():\n    kernel_lacks('tc netem')\n\n"
        "def test_skips_for_a_tool():\n    pytest.skip('haproxy is not installed')\n"
    )
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(ROOT / "tests")}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs", str(tmp_path)]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "1 failed, 1 skipped" in done.stdout, done.stdout[-2000:]
    assert "this kernel lacks tc netem" in done.stdout and "skipped under CI=true" in done.stdout
