"""The ``roles`` target spec: replica names, what it refuses (file:line), and the preflight's replica rule."""

from __future__ import annotations

import pytest

from chaos.spec.preflight import preflight
from chaos.spec.roles import RolesTarget
from chaos.spec.scenario import ScenarioError, parse_scenario

SCENARIO = """\
name: roles
target:
  type: roles
  roles:
    lighthouse:
      command: [torchft_lighthouse, --min_replicas, 1]
      port: 29510
    group:
      torchrun: {script: tests/jobs/torchft_train.py, args: [--steps, 50]}
      replicas: 2
      after: [lighthouse]
      env: {REPLICA_GROUP_ID: "{index}"}
      restart: {policy: on-failure, delay: 2s}
  until: [group]
faults:
  - name: kill-group
    type: kill
    params: {replica: %s}
    trigger: {after: 10s}
checks:
  - type: survivors_progress
    params: {fault: kill-group, max_stall: 10s}
"""


def test_a_roles_target_names_each_replica() -> None:
    scenario = parse_scenario(SCENARIO % "group.1")
    target = scenario.target
    assert isinstance(target, RolesTarget)
    assert target.replica_names() == ["lighthouse", "group.0", "group.1"]
    assert target.start_order() == ["lighthouse", "group"]
    assert target.roles["group"].restart.delay == 2.0
    assert target.roles["group"].torchrun is not None and target.roles["group"].torchrun.args == ["--steps", "50"]
    assert preflight(scenario) == []


def test_the_preflight_refuses_a_replica_the_target_does_not_have() -> None:
    problems = preflight(parse_scenario(SCENARIO % "group.2"))
    assert len(problems) == 1
    assert "no replica named 'group.2'" in problems[0].message
    assert "group.0, group.1" in problems[0].message


@pytest.mark.parametrize(
    ("role", "message"),
    [
        ("x: {command: [a], torchrun: {script: b.py}}", "exactly one of command or torchrun"),
        ("x: {env: {A: b}}", "exactly one of command or torchrun"),
        ("x: {command: [a], after: [y]}", "starts after 'y', which is not a role"),
        ("x: {command: [a], port: 80, replicas: 2}", "a role with a single replica"),
        ("x.y: {command: [a]}", "no dots"),
        ("x: {command: [a], restart: {policy: sometimes}}", "policy"),
        ("x: {command: [a], after: [z]}\n    z: {command: [b], after: [x]}", "cycle"),
    ],
)
def test_what_a_roles_target_refuses(role: str, message: str) -> None:
    text = f"name: bad\nallow_no_checks: true\ntarget:\n  type: roles\n  roles:\n    {role}\n"
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text)
    assert message in str(caught.value)
    assert ":5:" in str(caught.value) or ":4:" in str(caught.value) or ":6:" in str(caught.value)


def test_a_role_runs_on_an_inventory_host_or_spreads_its_replicas_over_a_list() -> None:
    spec = RolesTarget.model_validate(
        {
            "type": "roles",
            "roles": {
                "lighthouse": {"command": ["lh"], "host": "h1"},
                "group": {"command": ["train"], "replicas": 3, "host": ["h2", "h3"]},
                "here": {"command": ["x"]},
            },
        }
    )
    group = spec.roles["group"]
    assert [group.host_of(i) for i in range(3)] == ["h2", "h3", "h2"]
    assert spec.roles["here"].host_of(0) is None
    assert spec.hosts() == ["h1", "h2", "h3"]


def test_a_scenario_with_roles_on_hosts_needs_an_inventory() -> None:
    from chaos.cluster.hosts import HostsError, HostSet

    scenario = parse_scenario(
        "name: x\ntarget:\n  type: roles\n  roles: {a: {command: [sleep, '1'], host: h1}}\nchecks: [{type: completes}]\n"
    )
    with pytest.raises(HostsError, match="no inventory was given"):
        HostSet.for_scenario(scenario, None, None)


def _partition(ports: str) -> str:
    """SCENARIO with a partition of ``ports`` instead of the kill."""
    fault = f"type: partition\n    params: {{peers: [127.0.0.1], ports: {ports}}}\n    trigger: {{after: 1s}}\n    duration: 1s"
    return (SCENARIO % "group.1").replace(
        "type: kill\n    params: {replica: group.1}\n    trigger: {after: 10s}", fault
    )


def test_a_network_fault_may_name_a_roles_port_by_its_role() -> None:
    scenario = parse_scenario(_partition("[lighthouse, 29400]"))
    assert scenario.faults[0].params.ports == ["lighthouse", 29400]  # type: ignore[attr-defined]
    assert preflight(scenario) == []


@pytest.mark.parametrize(("ports", "fix"), [("[group]", "name a role with a port (lighthouse)"), ("[rdzv]", "nodes:")])
def test_the_preflight_refuses_a_port_name_the_target_does_not_serve(ports: str, fix: str) -> None:
    problems = preflight(parse_scenario(_partition(ports)))
    assert len(problems) == 1, problems
    assert "names no port" in problems[0].message or "rendezvous store" in problems[0].message, problems[0]
    assert fix in problems[0].hint, problems[0]
