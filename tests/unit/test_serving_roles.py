"""A serving fleet as a ``roles`` target, the parts that need no process: HAProxy's log lines become the
detection and failback events the serving checks read, the spec refuses what cannot work (two roles claiming one
backend, a load path with nowhere to go), ``{port:ROLE}`` names a role's port, and a role whose program is not
installed is refused before anything starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaos.cluster.local import LocalTransport
from chaos.spec.problems import ScenarioError
from chaos.spec.roles import RolesTarget
from chaos.spec.scenario import parse_scenario
from chaos.targets.balancers import BACKEND_DOWN, BACKEND_UP, balancer_matchers
from chaos.targets.base import TargetUnusable
from chaos.targets.roles import RolesJob, ServingRolesJob

DOWN = (
    '[WARNING]  (6227) : Server models/primary is DOWN, reason: Layer4 connection problem, info: "Connection '
    'refused", check duration: 0ms. 0 active and 1 backup servers left. Running on backup.'
)
DOWN_LIVE = (
    '[WARNING]  (6227) : Server models/primary is DOWN, reason: Health analyze, info: "Detected 1 consecutive '
    'errors, last one was: L4 unsuccessful connection". 0 active and 1 backup servers left.'
)
UP = (
    "[WARNING]  (6227) : Server models/primary is UP, reason: Layer7 check passed, code: 200, check duration: 1ms. "
    "1 active and 1 backup servers online."
)


def match(line: str) -> list[tuple[str, dict[str, object]]]:
    found = [m.match(line, 1) for m in balancer_matchers("haproxy")]
    return [(e.kind, {k: v for k, v in e.data.items() if k != "line"}) for e in found if e is not None]


def test_haproxy_server_state_lines_become_backend_events() -> None:
    assert match(DOWN) == [
        (BACKEND_DOWN, {"proxy": "models", "backend": "primary", "reason": "Layer4 connection problem"})
    ]
    assert match(DOWN_LIVE) == [(BACKEND_DOWN, {"proxy": "models", "backend": "primary", "reason": "Health analyze"})]
    assert match(UP) == [(BACKEND_UP, {"proxy": "models", "backend": "primary", "reason": "Layer7 check passed"})]
    assert match("[NOTICE]   (6226) : haproxy version is 2.6.12") == []
    assert match("Proxy api started.") == []


def fleet(**extra: object) -> dict[str, object]:
    roles: dict[str, object] = {
        "primary": {"command": ["sleep", "{port:primary}"], "port": 18181, "backend": "primary"},
        "lb": {"command": ["sleep"], "port": 18180, "balancer": "haproxy", "env": {"P": "{port:primary}"}},
    }
    return {"type": "roles", "roles": roles, **extra}


def test_two_roles_cannot_claim_one_backend() -> None:
    spec = fleet()
    spec["roles"] = {**spec["roles"], "other": {"command": ["server"], "backend": "primary"}}  # type: ignore[dict-item]
    with pytest.raises(ValidationError, match="same backend name"):
        RolesTarget.model_validate(spec)


def test_a_backend_names_one_server() -> None:
    spec = fleet()
    spec["roles"] = {"primary": {"command": ["server"], "backend": "primary", "replicas": 2}}
    with pytest.raises(ValidationError, match="backend names one server"):
        RolesTarget.model_validate(spec)


LOAD = "load: {url: /v1/predict, rate: 10, duration: 1s}\nchecks: [{type: completes}]\n"


def test_a_load_path_needs_the_fleets_url() -> None:
    with pytest.raises(ScenarioError, match=r"fleet.yaml:5:1: load: .*roles target has no url"):
        parse_scenario("name: x\ntarget:\n  type: roles\n  roles: {a: {command: [sleep, '1']}}\n" + LOAD, "fleet.yaml")
    scenario = parse_scenario(
        "name: x\ntarget:\n  type: roles\n  url: http://127.0.0.1:18180\n  roles: {a: {command: [sleep, '1']}}\n"
        + LOAD,
        "fleet.yaml",
    )
    assert isinstance(scenario.target, RolesTarget) and scenario.target.url == "http://127.0.0.1:18180"


def test_port_placeholders_name_each_roles_port(tmp_path: Path) -> None:
    job = RolesJob(RolesTarget.model_validate(fleet()), LocalTransport(), tmp_path, seed=1)
    job._choose_ports()
    values = job._values(job._replicas[-1])
    assert values["port:primary"] == "18181" and values["port:lb"] == "18180"
    recorded = [e for e in job.poll_events() if e.kind == "target.ports"]
    assert [e.data for e in recorded] == [{"ports": {"primary": 18181, "lb": 18180}, "chosen": []}]


def test_auto_ports_are_chosen_free_per_run_and_recorded(tmp_path: Path) -> None:
    spec = fleet(url="http://127.0.0.1:{port:lb}")
    spec["roles"]["primary"]["port"] = "auto"  # type: ignore[index]
    spec["roles"]["lb"]["port"] = "auto"  # type: ignore[index]
    target = RolesTarget.model_validate(spec)
    chosen = []
    for run in range(2):
        job = ServingRolesJob(target, LocalTransport(), tmp_path / str(run), seed=1)
        job._choose_ports()
        ports = {name: int(job._values(job._replicas[-1])[f"port:{name}"]) for name in ("primary", "lb")}
        assert job.url == f"http://127.0.0.1:{ports['lb']}"
        (event,) = [e for e in job.poll_events() if e.kind == "target.ports"]
        assert event.data == {"ports": ports, "chosen": ["primary", "lb"]}
        for port in ports.values():  # free when chosen: this test can listen on it
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))
        chosen.append(ports)
    assert len({*chosen[0].values(), *chosen[1].values()}) == 4  # drawn at random, not from the seed


def test_a_port_placeholder_must_name_a_role_with_a_port() -> None:
    spec = fleet()
    spec["roles"]["lb"]["env"] = {"P": "{port:nobody}"}  # type: ignore[index]
    with pytest.raises(ValidationError, match=r"role 'lb' env P names \{port:nobody\}, but there is no role"):
        RolesTarget.model_validate(spec)
    spec["roles"]["lb"]["env"] = {"P": "{port:other}"}  # type: ignore[index]
    spec["roles"]["other"] = {"command": ["sleep"]}  # type: ignore[index]
    with pytest.raises(ValidationError, match="role 'other' has no port: give it `port: auto`"):
        RolesTarget.model_validate(spec)


def test_a_fleet_with_a_url_waits_for_ready_and_serves_there(tmp_path: Path) -> None:
    job = ServingRolesJob(
        RolesTarget.model_validate(fleet(url="http://127.0.0.1:18180")), LocalTransport(), tmp_path, seed=1
    )
    assert job.ready_event == "target.ready" and job.url == "http://127.0.0.1:18180"


def test_a_role_whose_program_is_missing_is_refused_before_anything_starts(tmp_path: Path) -> None:
    spec = fleet()
    spec["roles"] = {**spec["roles"], "lb": {"command": ["haproxy-not-installed-here", "-db"]}}  # type: ignore[dict-item]
    job = RolesJob(RolesTarget.model_validate(spec), LocalTransport(), tmp_path, seed=1)
    with pytest.raises(TargetUnusable, match="role .lb. runs .haproxy-not-installed-here., which is not installed"):
        job.preflight()


def test_a_roles_python_is_its_interpreter_and_bin(tmp_path: Path) -> None:
    import shutil
    import sys

    spec = fleet()
    spec["roles"] = {"a": {"command": ["{python}", "x.py"], "python": "python3"}, "b": {"command": ["{bin}/tool"]}}
    job = RolesJob(RolesTarget.model_validate(spec), LocalTransport(), tmp_path, seed=1)
    a, b = job._replicas
    found = shutil.which("python3")
    assert found is not None
    assert job._values(a)["python"] == "python3" and job._values(a)["bin"] == str(Path(found).parent)
    assert job._values(b)["python"] == sys.executable and job._values(b)["bin"] == str(Path(sys.executable).parent)
