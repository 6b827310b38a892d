"""The rendezvous store as a target, before anything runs: the spec (``rdzv_backend``, ``rdzv_host``, ``hosts:
{role: rdzv_store}``, the port named ``rdzv``), where the store's host resolves, the agents' command lines, the log
lines that become ``target.rendezvous`` / ``detect.rendezvous_error``, and the ``port:`` process selector on a real
listening socket of this machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from chaos.cluster.hosts import RDZV_STORE, HostsError, HostSet
from chaos.cluster.local import LocalTransport
from chaos.history.torch_signatures import signature_matcher
from chaos.plugins.injector import InjectionContext, InjectionError
from chaos.spec.preflight import preflight
from chaos.spec.scenario import ScenarioError, TorchrunTarget, parse_scenario
from chaos.targets.base import TargetUnusable
from chaos.targets.torchrun_nodes import MultiNodeTorchrunJob, Node
from injectors.process import listeners
from injectors.process.faults import FreezeParams, resolve_processes

INVENTORY = """
hosts:
  - {name: h1, address: 10.0.0.11}
  - {name: h2, address: 10.0.0.12}
  - {name: h3, address: 10.0.0.13, groups: [etcd]}
"""


def _scenario(target: dict[str, Any], faults: list[dict[str, Any]] | None = None) -> str:
    base = {"type": "torchrun", "module": "m.train", "nproc_per_node": 1}
    doc = {"name": "s", "target": {**base, **target}, "faults": faults or [], "checks": [], "allow_no_checks": True}
    return json.dumps(doc)


ETCD = {"nodes": {"group": "all"}, "rdzv_backend": "etcd-v2", "rdzv_host": {"group": "etcd"}, "rdzv_port": 2379}
STORE_FAULT = {
    "name": "cut",
    "type": "partition",
    "hosts": {"role": "rdzv_store"},
    "params": {"peers": ["group:all"], "ports": ["rdzv"]},
    "trigger": {"after": "1s"},
    "duration": "5s",
}


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"nodes": {"group": "all"}, "rdzv_backend": "etcd-v2", "rdzv_port": 2379}, "needs nodes: and rdzv_host"),
        ({**ETCD, "rdzv_port": "auto"}, "give etcd's client port"),
        ({"nodes": {"group": "all"}, "rdzv_host": {"host": "h3"}}, "rdzv_host is for etcd-v2"),
        ({**ETCD, "rdzv_host": {"role": "rdzv_store"}}, "not rank, slurm or role"),
    ],
)
def test_etcd_target_spec_is_refused_when_incomplete(target: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(_scenario(target))


def test_role_is_one_host_and_excludes_the_other_selectors() -> None:
    for hosts, message in (
        ({"role": "rdzv_store", "host": "h1"}, "not host and role"),
        ({"role": "rdzv_store", "count": 2}, "single host"),
    ):
        with pytest.raises(ScenarioError, match=message):
            parse_scenario(_scenario({"nodes": {"group": "all"}}, [{**STORE_FAULT, "hosts": hosts}]))


def test_the_store_and_its_port_need_a_job_spread_over_hosts() -> None:
    single = parse_scenario(_scenario({}, [STORE_FAULT]))
    messages = [problem.message for problem in preflight(single)]
    assert any("rendezvous store" in m and "hosts: {role: rdzv_store}" in m for m in messages), messages
    assert any("port rdzv is a multi-node torchrun job's" in m for m in messages), messages
    assert not preflight(parse_scenario(_scenario({"nodes": {"group": "all"}}, [STORE_FAULT])))


@pytest.mark.parametrize(("target", "store"), [({"nodes": {"group": "all"}}, "h1"), (ETCD, "h3")])
def test_the_store_role_resolves_to_the_stores_host(tmp_path: Path, target: dict[str, Any], store: str) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    scenario = parse_scenario(_scenario(target, [STORE_FAULT]))
    hosts = HostSet.for_scenario(scenario, inventory, None)
    assert hosts.roles == {RDZV_STORE: store}
    assert hosts.resolve(scenario.faults[0], "cut#1", seed=1) == [store]
    hosts.roles.clear()
    with pytest.raises(HostsError, match="rendezvous store"):
        hosts.resolve(scenario.faults[0], "cut#1", seed=1)


def test_etcd_agents_meet_at_the_users_etcd(tmp_path: Path) -> None:
    spec = parse_scenario(_scenario(ETCD)).target
    assert isinstance(spec, TorchrunTarget)
    nodes = [Node(f"h{i}", f"10.0.0.{10 + i}", LocalTransport()) for i in (1, 2)]
    job = MultiNodeTorchrunJob(spec, nodes, tmp_path / "run-1", 3, store=Node("h3", "10.0.0.13", LocalTransport()))
    argv = job.argv(1)
    assert argv[argv.index("--rdzv-backend") + 1] == "etcd-v2"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.13:2379"
    assert "--rdzv-conf" not in argv  # is_host is c10d's
    assert job.port_named("rdzv") == 2379 and job.port_named("other") is None
    assert job.store.name == "h3"


def test_c10d_store_port_is_known_once_chosen(tmp_path: Path) -> None:
    spec = parse_scenario(_scenario({"nodes": {"group": "all"}})).target
    assert isinstance(spec, TorchrunTarget)
    job = MultiNodeTorchrunJob(spec, [Node("h1", "10.0.0.11", LocalTransport())], tmp_path / "run-1", 3)
    assert job.port_named("rdzv") is None and job.store.name == "h1"  # rdzv_port: auto is chosen at start
    with pytest.raises(InjectionError, match="names no port"):
        InjectionContext(LocalTransport(), target=job).port("rdzv")


@pytest.mark.parametrize(
    ("line", "kind", "field", "value"),
    [
        (
            "I1129 09:16:21.595000 28963 torch/distributed/elastic/agent/server/api.py:553] [default] Rendezvous "
            "complete for workers. Result:",
            "target.rendezvous",
            "role",
            "default",
        ),
        (
            "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store "
            "has failed. See inner exception for details.",
            "detect.rendezvous_error",
            "signature",
            "rendezvous_error",
        ),
        (
            "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
            "detect.rendezvous_error",
            "detector",
            "torchrun",
        ),
    ],
)
def test_agent_log_lines_become_rendezvous_events(line: str, kind: str, field: str, value: str) -> None:
    event = signature_matcher().match(line, 1)
    assert event is not None and event.kind == kind and event.data[field] == value
    assert event.rank is None  # an agent's line: the host tags it, no rank


def test_an_agent_starting_a_rendezvous_is_no_completed_round() -> None:
    line = "I1129 09:16:20.519000 28963 torch/distributed/elastic/agent/server/api.py:707] [default] Rendezvous'ing"
    assert signature_matcher().match(line + " worker group", 1) is None


def test_port_selector_finds_the_process_listening_there() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert listeners.listening_pids(LocalTransport(), port) == [os.getpid()]
        # this very process: the selector finds it, and the harness's own process is never a target
        with pytest.raises(InjectionError, match="the harness itself"):
            resolve_processes(InjectionContext(LocalTransport()), FreezeParams(port=port))
    assert listeners.listening_pids(LocalTransport(), port) == []
    with pytest.raises(InjectionError, match="no running process for the process listening on port"):
        resolve_processes(InjectionContext(LocalTransport()), FreezeParams(port=port))


def test_etcd_target_is_refused_where_the_job_cannot_import_python_etcd(tmp_path: Path) -> None:
    bare = Path("/usr/bin/python3")  # Debian's own interpreter: no python-etcd unless someone installed it there
    if not bare.exists() or not subprocess.run([bare, "-c", "import etcd"], capture_output=True).returncode:
        pytest.skip("needs a python3 without python-etcd at /usr/bin/python3")
    spec = parse_scenario(_scenario({**ETCD, "python": str(bare)})).target
    assert isinstance(spec, TorchrunTarget)
    store = Node("h3", "10.0.0.13", LocalTransport())
    job = MultiNodeTorchrunJob(spec, [Node("h1", "10.0.0.11", LocalTransport())], tmp_path / "r", 3, store=store)
    with pytest.raises(TargetUnusable, match="cannot import etcd: torch's etcd-v2 rendezvous needs python-etcd"):
        job.preflight()
