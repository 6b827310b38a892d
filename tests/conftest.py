"""Suite-wide fixtures, visible from tests/unit, tests/integration and tests/e2e alike: every test's journals
live in a temporary state directory, never /var/lib/mlchaos (``isolated_state_dir`` gives one test a state
directory of its own); one report root for the end-to-end training runs (their golden runs are cached there
once), and one real kill-rank run shared by the tests that only read its outcome; the real testbeds.

The testbeds are session-wide and built only when a test asks for them:

- ``testbed``: 3 hosts of network namespaces + one sshd each (:mod:`chaos.testbed.namespaces`); skips,
  with the reason, where one cannot be built (not root, no ``ip netns``, no sshd). ``testbed_transports``: one
  connected SshTransport per host for one test.
- ``docker_testbed``: 3 containers as hosts h1..h3 (``transport: docker``); skips where no Docker daemon can run
  (``bash scripts/start-dockerd.sh`` fails). ``docker_transports``: one DockerTransport per host for one test.

Both testbeds are torn down in ``finally``, even when ``up`` failed half way.

Under CI (``CI=true``) a skip is a failure unless this kernel is the reason (see tests/capabilities.py): what
scripts/setup.sh provides is never silently untested there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# The CI rule on skips, as hooks of this conftest (see tests/capabilities.py).
from capabilities import pytest_make_collect_report as pytest_make_collect_report
from capabilities import pytest_runtest_makereport as pytest_runtest_makereport
from support import ROOT, docker_unavailable, standing, transports_per_host

if TYPE_CHECKING:
    from chaos.cluster.docker import DockerTransport
    from chaos.cluster.inventory import Inventory
    from chaos.cluster.ssh import SshTransport
    from chaos.run.result import RunResult

TESTBED_HOSTS = 3
DOCKER_HOSTS = 3

# Under pytest-xdist (`make test` runs `--dist loadfile`) each module is one unit of work, so its module-scoped
# runs are made once; modules that read one session-wide run share a unit, so it is made once.
_SHARED_RUNS = {"test_e2e_training.py": "kill-rank-run", "test_e2e_report.py": "kill-rank-run"}
# Longest first, so that no long module starts last: end-to-end runs, then real daemons, then pure logic; and
# inside e2e the modules that took longest (2026-11-28, 4 workers: 200-370 s each) before all others.
_FOLDER_ORDER = {"e2e": 0, "integration": 1, "unit": 2}
_HEAVIEST_FIRST = (
    "test_e2e_torchft",
    "test_e2e_docker",
    "test_e2e_multinode",
    "test_e2e_training",
    "test_e2e_sdc",
    "test_e2e_slurm_node_failure",
    "test_e2e_serving",
    "test_e2e_checkpoint_faults",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heaviest modules first (each keeps its own order of tests), so parallel workers end together."""
    order = {id(item): index for index, item in enumerate(items)}

    def weight(item: pytest.Item) -> tuple[int, int, int]:
        stem = item.path.stem
        heavy = _HEAVIEST_FIRST.index(stem) if stem in _HEAVIEST_FIRST else len(_HEAVIEST_FIRST)
        return (_FOLDER_ORDER.get(item.path.parent.name, 1), heavy, order[id(item)])

    items.sort(key=weight)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with the modules of :data:`_SHARED_RUNS` as one unit. (Not ``xdist_group`` marks
    with ``--dist loadgroup``: xdist 3.8 writes the group into ``item._nodeid``, which pytest 9.2 no longer
    reads, so every test became a unit of its own and module-scoped runs were made once per worker.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    # xdist reorders units by their number of tests (most first) unless told not to: that sent the one-test
    # end-to-end modules last and left one worker alone on them at the end. Keep pytest_collection_modifyitems'
    # order (heaviest first).
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndSharedRuns(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return _SHARED_RUNS.get(module.rsplit("/", 1)[-1], module)

    return ModulesAndSharedRuns(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """With ``MLCHAOS_TEST_CPU=FILE``: append each test's wall and CPU seconds (this process and the children
    it waited for: ranks, torchrun, daemons it reaped) to FILE, one tab-separated line per test. The suite is
    CPU-bound under parallel workers, so CPU, not wall time, says what a test costs (docs/test-time.md)."""
    out = os.environ.get("MLCHAOS_TEST_CPU")
    if not out:
        return (yield)
    import resource
    import time

    def cpu() -> tuple[float, float]:
        mine, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return mine.ru_utime + mine.ru_stime, kids.ru_utime + kids.ru_stime

    began, (self_before, kids_before) = time.monotonic(), cpu()
    try:
        return (yield)
    finally:
        self_after, kids_after = cpu()
        with open(out, "a") as sink:
            sink.write(
                f"{item.nodeid}\t{time.monotonic() - began:.2f}\t{self_after - self_before:.2f}"
                f"\t{kids_after - kids_before:.2f}\n"
            )


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("mlchaos-state")
    previous = os.environ.get("MLCHAOS_STATE_DIR")
    os.environ["MLCHAOS_STATE_DIR"] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop("MLCHAOS_STATE_DIR", None)
        else:
            os.environ["MLCHAOS_STATE_DIR"] = previous


@pytest.fixture
def isolated_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own state directory (its journals and dead-man records), so tests never see each other's."""
    monkeypatch.setenv("MLCHAOS_STATE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def e2e_report_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One report root for end-to-end runs of the shipped training scenarios: a golden run is computed once
    per job and seed and then read from ``.golden/`` by every later run. Under pytest-xdist every worker of
    the session shares it (the golden cache locks an entry while one run computes it)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "e2e-reports"  # the session's folder, above each worker's
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("e2e-reports")


@pytest.fixture(scope="session")
def kill_rank_run(e2e_report_root: Path) -> RunResult:
    """``scenarios/kill-rank.yaml`` run for real once per session (about 30 s with its golden run)."""
    from chaos.run.orchestrator import RunOptions, execute
    from chaos.spec.scenario import load_scenario

    source = ROOT / "scenarios" / "kill-rank.yaml"
    return execute(load_scenario(source), RunOptions(report_root=e2e_report_root, scenario_file=source))


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inventory]:
    from chaos.testbed import namespaces as tb

    state = tmp_path_factory.mktemp("chaos-tb")
    yield from standing(tb.unsupported_reason(), lambda: tb.up(TESTBED_HOSTS, state), lambda: tb.down(state))


@pytest.fixture
def testbed_transports(testbed: Inventory) -> Iterator[dict[str, SshTransport]]:
    from chaos.cluster.ssh import SshTransport

    with transports_per_host(testbed, SshTransport.for_host) as transports:
        yield transports


@pytest.fixture(scope="session")
def docker_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chaos-dtb")


@pytest.fixture(scope="session")
def docker_testbed(docker_state_dir: Path) -> Iterator[Inventory]:
    from chaos.testbed import containers as dtb

    yield from standing(
        docker_unavailable(), lambda: dtb.up(DOCKER_HOSTS, docker_state_dir), lambda: dtb.down(docker_state_dir)
    )


@pytest.fixture
def docker_transports(docker_testbed: Inventory) -> Iterator[dict[str, DockerTransport]]:
    from chaos.cluster.docker import DockerTransport

    with transports_per_host(docker_testbed, DockerTransport.for_host) as transports:
        yield transports
