"""One preflight: whatever `run` would refuse before starting, `validate` refuses first,
with the file:line of the offending key and a fix.

Defects pinned: `validate` accepted an in-job bit flip with an `after:` trigger that `run` then refused; a
process selector that cannot resolve (`kill {rank: 5}` on a 2-rank torchrun job, a replica of a target that has
none) validated AND ran, the fault failing only when it fired. The table below runs every refusal through both
code paths: `mlchaos validate` and the orchestrator's `execute` (a scenario built in code goes through it too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import COMMAND, TORCHRUN, RefusingInjector
from typer.testing import CliRunner

from chaos.cli.commands import app
from chaos.plugins import registry
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_INVALID
from chaos.spec.preflight import preflight, world_size
from chaos.spec.scenario import parse_scenario, scenario_model

SERVING = TORCHRUN.replace(
    "  type: torchrun\n  module: chaos.reference.trainer\n  nproc_per_node: 2\n",
    "  type: serving\n  fallback: null\n  port: 0\n",
)
HTTP = TORCHRUN.replace(
    "  type: torchrun\n  module: chaos.reference.trainer\n  nproc_per_node: 2\n",
    "  type: http\n  url: http://127.0.0.1:9\n  ready_timeout: 5s\n",
)


def _one_fault(base: str, **keys: str) -> str:
    """``base`` with its FAULTS line replaced by one fault: ``keys`` one a line, in the order given (line 7 is the
    first, written ``- key: value``)."""
    first, *rest = (f"{key}: {value}" for key, value in keys.items())
    return base.replace("FAULTS", "\n".join([f"  - {first}", *(f"    {line}" for line in rest)]))


def _partition(base: str, hosts: str, trigger: str) -> str:
    """``base`` with one 1 s partition of ``hosts`` (line 9) from 10.0.0.1, fired by ``trigger``."""
    return _one_fault(base, type="partition", params="{peers: [10.0.0.1]}", hosts=hosts, trigger=trigger, duration="1s")


# (id, scenario text, line:column of the key at fault, words the refusal says). Line 7 is the fault's first line.
REFUSED = [
    (
        "in-job bitflip with an after trigger",
        _one_fault(TORCHRUN, type="bitflip", params="{where: weights}", trigger="{after: 3s}"),
        "9:15",
        "applied inside the job at a training step, so it needs an at_step trigger (got after)",
    ),
    (
        "in-job grad_corrupt with an every trigger",
        _one_fault(TORCHRUN, type="grad_corrupt", params="{rank: 1}", trigger="{every: {interval: 1s, count: 2}}"),
        "9:15",
        "needs an at_step trigger (got every)",
    ),
    (
        "kill rank 5 of a 2-rank torchrun job",
        _one_fault(TORCHRUN, type="kill", params="{rank: 5}", trigger="{at_step: 3}"),
        "8:14",
        "rank 5 does not exist: the job runs 2 rank(s), 0..1",
    ),
    (
        "a trigger's rank beyond the world size",
        _one_fault(TORCHRUN, type="kill", params="{rank: 0}", trigger="{at_step: 3, rank: 2}"),
        "9:27",
        "rank 2 does not exist",
    ),
    (
        "an in-job fault's rank beyond the world size",
        _one_fault(TORCHRUN, type="bitflip", params="{rank: 3}", trigger="{at_step: 3}"),
        "8:14",
        "rank 3 does not exist",
    ),
    (
        "freeze a rank of a command target, which reports none",
        _one_fault(COMMAND, type="freeze", params="{rank: 0}", trigger="{after: 1s}", duration="1s"),
        "8:14",
        "selects rank 0, but a command target does not report ranks",
    ),
    (
        "a freeze without a duration (it would be refused only when it fires)",
        _one_fault(TORCHRUN, type="freeze", params="{rank: 1}", trigger="{at_step: 3}"),
        "7:5",
        "holds its target until a deadline, so it needs a duration",
    ),
    (
        "a storage stall without a duration",
        _one_fault(TORCHRUN, type="storage", params="{path: /tmp/x, mode: hang}", trigger="{at_step: 3}"),
        "7:5",
        "needs a duration",
    ),
    (
        "a replica the serving target does not have",
        _one_fault(SERVING, type="kill", params="{replica: fallback}", trigger="{after: 1s}"),
        "8:14",
        "no replica named 'fallback'; this target has primary",
    ),
    (
        "a replica of a torchrun target",
        _one_fault(TORCHRUN, type="kill", params="{replica: primary}", trigger="{after: 1s}"),
        "8:14",
        "target has no replicas (only a roles or serving target has)",
    ),
    (
        "an in-job fault on a rank that runs no replica",
        _one_fault(SERVING, type="bitflip", params="{rank: 1}", trigger="{at_step: 3}"),
        "8:14",
        "rank 1 runs no replica of this serving target (ranks: 0 = primary)",
    ),
    (
        "an in-job fault on an http target",
        _one_fault(HTTP, type="bitflip", params="{}", trigger="{at_step: 3}"),
        "7:5",
        "no agent of ours runs in it",
    ),
    (
        "hosts by rank of a job on one host",
        _partition(TORCHRUN, "{rank: 1}", "{at_step: 3}"),
        "9:13",
        "means the host running that rank, but this job runs on one host",
    ),
    (
        "a protected host",
        _partition(COMMAND.replace("faults:", "cluster: {protected: [h1]}\nfaults:"), "{host: h1}", "{after: 1s}"),
        "10:13",
        "host 'h1' is protected",
    ),
    (
        "more hosts than the blast radius",
        _partition(
            COMMAND.replace("faults:", "safety: {blast_radius: 2}\nfaults:"), "{group: all, count: 3}", "{after: 1s}"
        ),
        "10:25",
        "count 3 is more hosts than the blast radius of 2 allows",
    ),
]


def _validate(tmp_path: Path, text: str, *args: str) -> tuple[int, str, Path]:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", *args, str(path)])
    return result.exit_code, result.output, path


@pytest.mark.parametrize(("text", "at", "says"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_every_refusal_of_run_is_made_by_validate_first(tmp_path: Path, text: str, at: str, says: str) -> None:
    code, output, path = _validate(tmp_path, text)
    assert code == EXIT_INVALID, output
    assert f"{path}:{at}: " in output and says in output and "fix: " in output, output
    # The orchestrator refuses the same scenario (say, one a Python test built) before anything starts.
    result = execute(parse_scenario(text, "bad.yaml"), RunOptions(report_root=tmp_path / "reports", golden=False))
    assert result.exit_code == EXIT_INVALID and result.ended_by == "refused"
    assert f"bad.yaml:{at}: " in result.error and says in result.error, result.error
    assert not result.history.of("runner.target_started") and not result.history.of("fault.*")
    # And `mlchaos run` refuses it with the same words, before starting any run.
    ran = CliRunner().invoke(app, ["run", str(path), "--report-dir", str(tmp_path / "cli-reports")])
    assert ran.exit_code == EXIT_INVALID and f"{path}:{at}: " in ran.output and says in ran.output, ran.output
    assert not (tmp_path / "cli-reports").exists(), "run started a run for a scenario the preflight refuses"


def test_the_scenarios_that_ship_pass_the_preflight() -> None:
    for path in sorted(Path(__file__).resolve().parents[2].joinpath("scenarios").glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        assert preflight(parse_scenario(text, str(path))) == [], path


def test_a_rank_within_the_world_and_selectors_that_resolve_pass() -> None:
    fine = TORCHRUN.replace("FAULTS", "  - type: kill\n    params: {rank: 1}\n    trigger: {at_step: 3, rank: 1}")
    assert preflight(parse_scenario(fine)) == []
    spread = fine.replace("nproc_per_node: 2", "nproc_per_node: 2\n  nodes: {group: all, count: 3}")
    scenario = parse_scenario(spread.replace("rank: 1}", "rank: 5}"))
    assert world_size(scenario) == 6 and preflight(scenario) == []
    unknown = parse_scenario(spread.replace(", count: 3", "").replace("rank: 1}", "rank: 40}"))
    assert world_size(unknown) is None and preflight(unknown) == [], "an inventory decides: left to the run"
    replica = SERVING.replace("fallback: null", "fallback: {model: small}")
    assert (
        preflight(
            parse_scenario(
                replica.replace("FAULTS", "  - type: kill\n    params: {replica: fallback}\n    trigger: {after: 1s}")
            )
        )
        == []
    )


def test_hosts_by_rank_is_accepted_once_nodes_spread_the_job(tmp_path: Path) -> None:
    text = next(text for name, text, _at, _words in REFUSED if name == "hosts by rank of a job on one host")
    code, output, _ = _validate(tmp_path, text)
    assert code == EXIT_INVALID and "this job runs on one host" in output
    code, output, path = _validate(tmp_path, text, "--nodes", "all")
    assert code == 0, output
    assert f"note {path}: uses inventory hosts; they were not checked" in output.replace("\n", " ")


def test_a_scenario_built_in_code_is_refused_with_the_path_of_the_key() -> None:
    data = {
        "name": "coded",
        "target": {"type": "torchrun", "module": "m", "nproc_per_node": 1},
        "faults": [{"type": "kill", "params": {"rank": 1}, "trigger": {"at_step": 1}}],
        "checks": [{"type": "completes"}],
    }
    scenario = scenario_model().model_validate(data)
    [problem] = preflight(scenario)
    assert str(problem).startswith("<scenario coded>:1:1: faults.0.params.rank: rank 1 does not exist")


def test_a_capability_this_kernel_lacks_is_refused_by_validate_for_a_local_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = COMMAND.replace("FAULTS", "  - type: kill\n    params: {pid: 4242}\n    trigger: {after: 1s}")
    scenario_model()  # built from the real registry before the patch (the file is valid)
    monkeypatch.setattr(registry, "injectors", lambda: {"kill": RefusingInjector})
    code, output, path = _validate(tmp_path, text)
    assert code == EXIT_INVALID, output
    assert f"{path}:7:5: faults.0.type: fault 'kill-1' (kill) is not supported here: this kernel lacks" in output
    result = execute(parse_scenario(text, "bad.yaml"), RunOptions(report_root=tmp_path / "reports", golden=False))
    assert (
        result.exit_code == EXIT_INVALID and "fault 'kill-1' (kill) is not supported here: this kernel" in result.error
    )
    # --no-probe checks the file only; a fault aimed at inventory hosts is left to the run, which probes them.
    assert _validate(tmp_path, text, "--no-probe")[0] == 0
    on_hosts = text.replace("    trigger:", "    hosts: {group: all}\n    trigger:")
    code, output, _ = _validate(tmp_path, on_hosts)
    assert code == 0 and "uses inventory hosts; they were not checked" in output.replace("\n", " "), output


def test_validate_with_an_inventory_refuses_a_selection_the_run_would(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  - {name: h1, address: 10.0.0.1}\n  - {name: h2, address: 10.0.0.2}\n")
    text = COMMAND.replace(
        "FAULTS",
        "  - type: partition\n    params: {peers: [10.0.0.1]}\n    hosts: {group: all, count: 3}\n"
        "    trigger: {after: 1s}\n    duration: 1s",
    )
    code, output, path = _validate(tmp_path, text, "--inventory", str(inventory))
    assert code == EXIT_INVALID and f"{path}:9:5: " in output, output
    assert "asked for 3 host(s) but only 2 candidate(s) are eligible" in output
    code, output, _ = _validate(
        tmp_path, text.replace("count: 3", "count: 2"), "--inventory", str(inventory), "--no-probe"
    )
    assert code == 0, output


def test_validate_with_an_inventory_refuses_a_rank_whose_every_node_is_protected(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  - {name: h1, address: 10.0.0.1}\n  - {name: h2, address: 10.0.0.2}\n")
    text = TORCHRUN.replace("nproc_per_node: 2", "nproc_per_node: 1\n  nodes: {group: all}").replace(
        "FAULTS", "  - type: kill\n    params: {rank: 0}\n    trigger: {at_step: 3}"
    )
    code, output, _ = _validate(tmp_path, text, "--inventory", str(inventory), "--no-probe")
    assert code == 0, output
    protected = text.replace("faults:", "cluster: {protected: [h1, h2]}\nfaults:")
    code, output, path = _validate(tmp_path, protected, "--inventory", str(inventory), "--no-probe")
    assert code == EXIT_INVALID and f"{path}:9:5: " in output and "is protected and cannot be targeted" in output, (
        output
    )


def test_validate_with_an_inventory_refuses_a_rank_beyond_the_world_the_inventory_gives(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  - {name: h1, address: 10.0.0.1}\n  - {name: h2, address: 10.0.0.2}\n")
    text = TORCHRUN.replace("nproc_per_node: 2", "nproc_per_node: 3\n  nodes: {group: all}").replace(
        "FAULTS", "  - type: kill\n    params: {rank: 99}\n    trigger: {at_step: 3}"
    )
    assert _validate(tmp_path, text, "--no-probe")[0] == 0  # without the inventory the world size is not known
    code, output, path = _validate(tmp_path, text, "--inventory", str(inventory), "--no-probe")
    assert code == EXIT_INVALID and f"{path}:9:14: rank 99 does not exist: the job runs 6 rank(s)" in output, output
    assert "(2 inventory node(s) x nproc_per_node 3), 0..5" in output.replace("\n", " ")
    assert _validate(tmp_path, text.replace("rank: 99", "rank: 5"), "--inventory", str(inventory), "--no-probe")[0] == 0
