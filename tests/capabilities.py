"""What the tests need from this machine, said in one place, and what a skip may mean under CI.

``scripts/setup.sh``, run as root on Debian (as ``make test`` and CI do), provides every tool and daemon the
fault families use: root itself, iproute2, iptables, tc, OpenSSH's sshd, FUSE, Docker, HAProxy, strace, Slurm and
munge, and the torchft and lightning extras. A test that lacks one of them skips with the reason on a machine
where the set-up could not do its work (not root, no apt), but under CI (``CI=true``) tests/conftest.py turns any
such skip into a failure that names what is missing: a CI run that skipped the iptables tests would land a change
nobody tested. Only what depends on the kernel itself may skip under CI: a reason built by :func:`kernel_lacks`
(tc netem is absent here) or :func:`kernel_has` (a test of its refusal, on a kernel that has it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import NoReturn

import pytest

# The one list of what may skip under CI: things no set-up script can add to (or take from) the running kernel.
KERNEL_FEATURES = {
    "tc netem": "the netem qdisc (sch_netem): delay and jitter use the NFQUEUE packet holder here instead",
}
_LACKS, _HAS = "this kernel lacks ", "this kernel has "
_ROOT = "root"
# Where a tool comes from when it is missing (Debian package names; scripts/setup.sh installs each as root).
_PACKAGE = {
    "ip": "iproute2",
    "tc": "iproute2",
    "sshd": "openssh-server",
    "ssh-keygen": "openssh-client",
    "fusermount3": "fuse3",
    "dockerd": "docker.io",
    "haproxy": "haproxy",
    "strace": "strace",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "munged": "munge",
}


def under_ci() -> bool:
    """True where the suite runs as CI (``CI`` set to true, 1 or yes), as ``.ci/run`` is run."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(*needs: str) -> str | None:
    """Why this machine cannot give a test ``needs`` (``"root"`` or tool names looked up on PATH), naming the
    first thing missing and where it comes from; None when everything is here."""
    for need in needs:
        if need == _ROOT:
            if os.geteuid() != 0:
                return "needs root (scripts/setup.sh and CI run as root)"
        elif shutil.which(need) is None:
            package = _PACKAGE.get(need, need)
            return f"{need} is not installed or not on PATH (Debian: {package}; scripts/setup.sh installs it as root)"
    return None


def require(*needs: str) -> None:
    """Skip the calling test (a failure under CI, see the module doc) when one of ``needs`` is missing."""
    reason = missing(*needs)
    if reason is not None:
        pytest.skip(reason)


def requires(*needs: str) -> pytest.MarkDecorator:
    """The mark form of :func:`require`, for a test or a module's ``pytestmark``."""
    reason = missing(*needs)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def kernel_lacks(what: str, detail: str = "") -> NoReturn:
    """Skip because this kernel lacks ``what`` (a key of :data:`KERNEL_FEATURES`): a skip CI allows."""
    _skip_for_kernel(_LACKS, what, detail or KERNEL_FEATURES.get(what, ""))


def kernel_has(what: str, detail: str) -> NoReturn:
    """Skip because this kernel has ``what`` and the test observes its absence: a skip CI allows."""
    _skip_for_kernel(_HAS, what, detail)


def _skip_for_kernel(mark: str, what: str, detail: str) -> NoReturn:
    if what not in KERNEL_FEATURES:
        raise ValueError(f"{what!r} is not in KERNEL_FEATURES: only what depends on the kernel may skip under CI")
    pytest.skip(f"{mark}{what}: {detail}")


def allowed_under_ci(reason: str) -> bool:
    """Whether a skip with ``reason`` may stay a skip under CI (only kernel-dependent reasons may)."""
    return reason.removeprefix("Skipped: ").startswith((_LACKS, _HAS))


# -- the rule as pytest hooks: tests/conftest.py takes them in (and so can any conftest that wants the rule) --


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)


def _fail_skip_under_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under CI, a skip for anything but this kernel becomes a failure that says what was missing."""
    if not (report.skipped and under_ci()) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report).removeprefix("Skipped: ")
    if not allowed_under_ci(reason):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true, where scripts/setup.sh provides what it needs: {reason} "
            "(only what depends on this kernel may skip: tests/capabilities.py)"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())  # type: ignore[attr-defined]
