"""torchft replica groups under the whole harness: ``scenarios/torchft-replica-killed.yaml`` (a lighthouse and two
replica groups as a ``roles`` target, group 1 SIGKILLed between steps, restarted by its policy), and the same
job misbehaving on purpose so the replica checks are seen failing a broken one:

- healthy: the survivor keeps committing steps, group 1 heals from it and rejoins, both hold identical
  parameters at every step after the rejoin (``survivors_progress``, ``rejoined_within``, ``replicas_agree``);
- ``--stale-group 1``: group 1 takes the peer's step but not its state: ``replicas_agree`` fails naming it;
- ``--crash-alone-group 0``: the survivor dies once its peer is gone: ``survivors_progress`` fails.

``scenarios/torchft-replica-frozen.yaml``: group 1 SIGSTOPped for 12 s (past the 5 s heartbeat timeout) heals on
resume and rejoins with no restart. ``scenarios/torchft-lighthouse-killed.yaml``: torchft 0.2.0 FAILS it (the
expected outcome, see the scenario's comment): a quorum cut by the lighthouse's death is not retried, every
group dies at its quorum timeout and the job starts over.

Skipped, with the reason, where torchft (the ``torchft`` extra) is not installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT, verdicts

from chaos.run.orchestrator import RunOptions, RunResult, execute
from chaos.spec.roles import RolesTarget
from chaos.spec.scenario import Scenario, load_scenario

pytest.importorskip("torchft", reason="torchft is not installed: pip install -e '.[torchft]' (scripts/setup.sh does)")

pytestmark = pytest.mark.slow

SCENARIO = ROOT / "scenarios" / "torchft-replica-killed.yaml"
FAULT = "kill-group-1"


def with_args(
    scenario: Scenario, *extra: str, env: dict[str, str] | None = None, restart_delay: float | None = None
) -> Scenario:
    """The scenario with ``extra`` appended to the replica groups' script arguments, ``env`` added and, when given,
    the groups' restart delay replaced."""
    target = scenario.target
    assert isinstance(target, RolesTarget)
    group = target.roles["group"]
    assert group.torchrun is not None
    run = group.torchrun.model_copy(update={"args": [*group.torchrun.args, *extra]})
    update: dict[str, object] = {"torchrun": run, "env": {**group.env, **(env or {})}}
    if restart_delay is not None:
        update["restart"] = group.restart.model_copy(update={"delay": restart_delay})
    roles = {**target.roles, "group": group.model_copy(update=update)}
    return scenario.model_copy(update={"target": target.model_copy(update={"roles": roles})})


def run(scenario: Scenario, root: Path) -> RunResult:
    return execute(scenario, RunOptions(report_root=root, scenario_file=SCENARIO))


def group_log(result: RunResult, replica: str) -> str:
    return (result.run_dir / f"{replica}.log").read_text(errors="replace")


def test_a_killed_replica_group_heals_and_rejoins_while_the_survivor_trains(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIO), tmp_path)
    got = verdicts(result)
    history = result.history
    exits = [e for e in history.of("target.role_exit") if e.get_str("replica") == "group.1"]
    assert exits and exits[0].get_int("code") == -9, exits  # the launcher (and its worker) died of the kill
    restarts = [e for e in history.of("target.role_restart") if e.get_str("replica") == "group.1"]
    assert restarts, "the roles target did not restart the killed group"
    assert got["survivors_progress"][0] == "pass", got
    assert got["rejoined_within"][0] == "pass", got
    assert got["replicas_agree"][0] == "pass", got
    assert got["completes"][0] == "pass", got
    assert result.verdict == "pass", got


def test_a_rejoined_group_with_stale_parameters_fails_replicas_agree(tmp_path: Path) -> None:
    result = run(with_args(load_scenario(SCENARIO), "--stale-group", "1"), tmp_path)
    got = verdicts(result)
    status, reason = got["replicas_agree"]
    assert status == "fail" and "replica(s) group.1 hold other parameters" in reason, got
    assert got["survivors_progress"][0] == "pass", got  # the survivor was fine: only the rejoin is broken


def test_a_survivor_that_dies_with_its_peer_fails_survivors_progress(tmp_path: Path) -> None:
    # The killed group stays down 12 s, past the lighthouse's 5 s heartbeat timeout: the survivor must then train
    # alone, which is when --crash-alone-group makes it die (a fast restart, 4 s on an idle machine, would rejoin
    # before it ever ran alone and the misbehaviour would never show).
    result = run(with_args(load_scenario(SCENARIO), "--crash-alone-group", "0", restart_delay=12.0), tmp_path)
    got = verdicts(result)
    status, reason = got["survivors_progress"]
    assert status == "fail" and "survivor group.0 died" in reason, got


def test_a_frozen_replica_group_heals_on_resume_without_a_restart(tmp_path: Path) -> None:
    result = run(load_scenario(ROOT / "scenarios" / "torchft-replica-frozen.yaml"), tmp_path)
    got = verdicts(result)
    status, reason = got["survivors_progress"]
    if status == "fail":
        # torchft 0.2.0's own failure (see the scenario's comment): when the freeze lands after the quorum that
        # still counts group 1, the survivor's all-reduce times out and torchft's DDP hook dies on `assert fut._fut`.
        # The check must say the survivor died, and the survivor's log must show exactly that.
        log = group_log(result, "group.0")
        assert "survivor group.0 died" in reason, got
        assert "Timed out waiting" in log and "assert fut._fut" in log, log[-3000:]
        pytest.xfail("torchft 0.2.0: the survivor died of `assert fut._fut` after an all-reduce timeout (recorded)")
    assert not [e for e in result.history.of("target.role_restart")], "a frozen group needs no restart"
    heals = [e for e in result.history.of("target.heal") if e.get_str("replica") == "group.1"]
    assert heals, "group 1 did not load the survivor's state when it resumed"
    assert got["survivors_progress"][0] == "pass", got
    assert got["rejoined_within"][0] == "pass", got
    assert got["replicas_agree"][0] == "pass", got
    assert result.verdict == "pass", got


LIGHTHOUSE = ROOT / "scenarios" / "torchft-lighthouse-killed.yaml"


def test_torchft_loses_the_run_when_the_lighthouse_dies_mid_quorum(tmp_path: Path) -> None:
    # torchft 0.2.0's defaults (TORCHFT_QUORUM_RETRIES=0), see the scenario's comment: the quorum request in flight
    # fails with the lighthouse and is never retried, so both groups exit at the quorum timeout and start over.
    # That is asserted every run. Whether the restarted groups then get past the pre-fault step within
    # recovered_within's 20 s depends on this machine's start-up time (33.5 s in one run, under 20 s in another):
    # a failed verdict is torchft's failure, recorded as xfail with its evidence; a pass must show the restart.
    result = run(load_scenario(LIGHTHOUSE), tmp_path)
    got = verdicts(result)
    died = [e for e in result.history.of("target.role_exit") if e.get_str("role") == "group" and e.get_int("code") == 1]
    assert {e.get_str("replica") for e in died} == {"group.0", "group.1"}, died  # both, at the quorum timeout
    assert "lighthouse quorum failed" in group_log(result, "group.0")
    restarted = [e for e in result.history.of("target.role_restart") if e.get_str("role") == "lighthouse"]
    assert restarted, "the lighthouse was killed but never restarted"
    if result.verdict == "fail":
        assert got["recovered_within"][0] == "fail", got
        pytest.xfail("torchft 0.2.0 did not retry the failed quorum request; the groups started over too late")
    assert got["recovered_within"][0] == "pass", got
