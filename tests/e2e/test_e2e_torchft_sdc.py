"""Silent gradient corruption in one torchft replica group, through the whole harness:
``scenarios/torchft-sdc-post-reduce.yaml`` flips an exponent bit of replica group 1's reduced gradient at step 40
(a ``grad_corrupt`` aimed at the replica with ``params.replica``). With the checksum guard (the scenario as
shipped) group 1's agent catches it inside torchft's all-reduce and reports it through torchft's error path, so
group 1 does not commit that step and both replicas agree at every step. Without the guard (``--guard none``,
the same job a user runs unguarded) group 1 commits the corruption: ``replicas_agree`` fails naming it.

Both runs happen once per module (about 20 s each). Skipped, with the reason, without torchft.
"""

from __future__ import annotations

import pytest
from support import ROOT, Runs, verdicts

from chaos.run.orchestrator import RunOptions, execute
from chaos.spec.roles import RolesTarget
from chaos.spec.scenario import Scenario, load_scenario

pytest.importorskip("torchft", reason="torchft is not installed: pip install -e '.[torchft]' (scripts/setup.sh does)")

pytestmark = pytest.mark.slow

SCENARIO = ROOT / "scenarios" / "torchft-sdc-post-reduce.yaml"


def unguarded(scenario: Scenario) -> Scenario:
    target = scenario.target
    assert isinstance(target, RolesTarget)
    group = target.roles["group"]
    assert group.torchrun is not None and "checksum" in group.torchrun.args
    args = [("none" if a == "checksum" else a) for a in group.torchrun.args]
    run = group.torchrun.model_copy(update={"args": args})
    roles = {**target.roles, "group": group.model_copy(update={"torchrun": run})}
    return scenario.model_copy(update={"target": target.model_copy(update={"roles": roles})})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    scenario = load_scenario(SCENARIO)
    return {
        name: execute(spec, RunOptions(report_root=tmp_path_factory.mktemp(name), scenario_file=SCENARIO))
        for name, spec in (("guarded", scenario), ("unguarded", unguarded(scenario)))
    }


def test_the_guard_catches_it_inside_torchfts_reduction_and_the_step_is_not_committed(runs: Runs) -> None:
    result = runs["guarded"]
    got = verdicts(result)
    history = result.history
    [applied] = history.of("fault.applied")
    assert applied.get_str("replica") in (None, "group.1") and applied.get_int("step") == 40, applied.data
    detections = history.of("detect.sdc")
    assert detections and {e.get_str("replica") for e in detections} == {"group.1"}, [e.data for e in detections]
    # torchft's error path: group 1's next step after the flip was not committed (torchft's step stayed at 39),
    # and group 1 then took group 0's state (target.heal) instead of its own corrupted one.
    after = [e for e in history.of("target.step") if e.get_str("replica") == "group.1" and e.ts_ns > applied.ts_ns]
    assert after and after[0].data.get("committed") is False and after[0].get_int("step") == 39, [
        e.data for e in after[:2]
    ]
    heals = [e for e in history.of("target.heal") if e.get_str("replica") == "group.1" and e.ts_ns > applied.ts_ns]
    assert heals, "group 1 did not heal from its peer after dropping the step"
    assert got["replicas_agree"][0] == "pass", got
    assert result.verdict == "pass", got


def test_without_the_guard_the_corrupted_step_is_committed_and_replicas_agree_fails(runs: Runs) -> None:
    got = verdicts(runs["unguarded"])
    assert not runs["unguarded"].history.of("detect.sdc")
    assert got["replicas_agree"][0] == "fail" and "group.1" in got["replicas_agree"][1], got
    assert runs["unguarded"].verdict == "fail", got
