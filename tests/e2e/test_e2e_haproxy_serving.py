"""A user's serving fleet under the whole harness: ``scenarios/serving-haproxy-failover.yaml`` runs Debian's
HAProxy in front of two model servers written like a user's (``tests/jobs/user_model_server.py``, which imports
nothing from chaos), each a role of a ``roles`` target, with no supervisor script. The primary is SIGKILLed under
load: HAProxy fails over to its backup server, the roles target restarts the primary, HAProxy fails back.

The same scenario with ``scenarios/haproxy/no-fallback.cfg`` (a balancer without a backup server) must FAIL:
every request during the outage is an error and nothing else answers them.

Both runs happen once per module (about 20 s each). Skipped, with the reason, where haproxy is not installed.
"""

from __future__ import annotations

import pytest
from support import NEEDS_HAPROXY, SCENARIOS, Runs, balancer_runs, pids_mentioning, verdicts_by_name

pytestmark = [pytest.mark.slow, NEEDS_HAPROXY]

SCENARIO = SCENARIOS / "serving-haproxy-failover.yaml"
NO_FALLBACK = "scenarios/haproxy/no-fallback.cfg"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return balancer_runs(SCENARIO, {"shipped": None, "no_fallback": NO_FALLBACK}, tmp_path_factory)


def test_a_killed_primary_fails_over_to_the_backup_and_back_with_no_supervisor_script(runs: Runs) -> None:
    result = runs["shipped"]
    got = verdicts_by_name(result)
    history = result.history
    killed = [e for e in history.of("target.role_exit") if e.get_str("replica") == "primary"]
    assert killed and killed[0].get_int("code") == -9, killed  # the kill landed on the primary's process
    starts = [e for e in history.of("serving.replica_start") if e.get_str("backend") == "primary"]
    assert len(starts) >= 2 and starts[0].get_int("pid") != starts[1].get_int("pid"), starts  # restarted
    ready_again = [e for e in history.of("target.role_ready") if e.get_str("replica") == "primary"]
    assert [e.get_int("attempt") for e in ready_again][:2] == [0, 1], ready_again
    down = [e for e in history.of("detect.backend_down") if e.get_str("backend") == "primary"]
    up = [e for e in history.of("serving.backend_up") if e.get_str("backend") == "primary"]
    assert down and down[0].source == "haproxy", down  # HAProxy's own log line is the detection
    assert up and up[-1].ts_ns > starts[1].ts_ns, up  # ... and the failback
    served = {e.get_str("backend") for e in history.of("load.request") if e.get_int("status") == 200}
    assert served == {"primary", "fallback"}, served  # X-Backend, set by HAProxy, names the server
    assert result.verdict == "pass", got


def test_a_balancer_without_a_fallback_fails_the_scenario(runs: Runs) -> None:
    result = runs["no_fallback"]
    got = verdicts_by_name(result)
    assert got["failover_within[kill-primary]"][0] == "fail", got
    assert got["error_rate_during"][0] == "fail", got
    assert result.verdict == "fail", got


def test_the_fleet_leaves_no_process_behind(runs: Runs) -> None:
    assert runs  # both runs are over
    assert not pids_mentioning("user_model_server.py"), "a model server outlived its run"
    assert not pids_mentioning("model-fleet.cfg") and not pids_mentioning("no-fallback.cfg"), "haproxy outlived its run"
