"""The silent large-packet drop story on the 3-host testbed, through the CLI as a user runs it.

One real run of ``scenarios/silent-large-packet-drop.yaml``, shared by the assertions: the hang watch reports
all_waiting, the link probe names rank 1's node's two links (small echoes answered, large ones lost) and clears
the third, the job stalls, heals and completes. The broken cases are judged on that run's REAL history: against
a fault that hit only one of the two named links (the check given the wrong pair) ``link_named`` fails; with
the diagnosis taken out (what a run with the hang watch off records: the same fault, the same stall, no
``detect.hang``/``detect.link``) it is unknown and the scenario fails, while ``stalled_during`` still passes (the
fault was real). A second real run with the hang watch off gives the same (docs/multi-host.md); it is not repeated here to
keep ``make test`` short. Afterwards no rule or process of the run may be left on any host.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import SCENARIOS, mlchaos, read_jsonl, write_inventory

from chaos.checks.base import CheckResult
from chaos.cluster.inventory import Inventory
from chaos.history.timeline import Event, History
from chaos.run.orchestrator import evaluate
from chaos.spec.scenario import Scenario, load_scenario

pytestmark = pytest.mark.slow

NAME = "silent-large-packet-drop"


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    run_dir: Path
    checks: dict[str, dict[str, Any]]
    history: list[dict[str, Any]]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.history if e["kind"] == kind]


def _run(scenario_file: Path, inventory_file: Path, reports: Path) -> Run:
    done = mlchaos("run", scenario_file, "--inventory", inventory_file, "--report-dir", reports, timeout=300)
    [run_dir] = [p for p in reports.iterdir() if p.name.startswith(NAME)]
    run = json.loads((run_dir / "run.json").read_text())
    checks = {c["name"]: c for c in run["checks"]}
    return Run(
        done.returncode,
        done.stdout[-4000:] + done.stderr[-2000:],
        run_dir,
        checks,
        read_jsonl(run_dir / "history.jsonl"),
    )


@pytest.fixture(scope="module")
def run(testbed: Inventory, tmp_path_factory: pytest.TempPathFactory) -> Run:
    folder = tmp_path_factory.mktemp("large-packet")
    return _run(SCENARIOS / f"{NAME}.yaml", write_inventory(testbed, folder), folder / "reports")


def _judged(run: Run, scenario: Scenario, without: tuple[str, ...] = ()) -> dict[str, CheckResult]:
    history = History.from_events([Event.model_validate(e) for e in run.history if e["kind"] not in without])
    return {r.check: r for r in evaluate(history, scenario)}


def _leftovers(inventory: Inventory, run_dirs: list[Path]) -> list[str]:
    found = []
    for host in inventory.hosts:
        rules = subprocess.run(
            ["ip", "netns", "exec", host.labels["netns"], "iptables-save"], capture_output=True, text=True, check=False
        ).stdout
        if "CHAOS" in rules or "mlchaos" in rules:
            found.append(f"iptables rules left on {host.name}")
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=False).stdout
    found += [f"process left: {line.strip()}" for line in ps.splitlines() if any(str(d) in line for d in run_dirs)]
    return found


def test_the_probe_names_the_link_while_pings_pass_and_the_job_recovers(run: Run) -> None:
    good = run
    assert good.returncode == 0, good.output
    assert {c["status"] for c in good.checks.values()} == {"pass"}, good.checks
    [applied] = good.of("fault.applied")
    hung = [e for e in good.of("detect.hang") if e["data"]["reason"] == "all_waiting"]
    assert hung and hung[0]["data"]["culprit_rank"] is None  # no rank is odd: every rank waits in one collective
    rank_host = {e["rank"]: e["data"]["host"] for e in good.of("target.start")}
    hit = applied["data"]["host"]
    assert hit == rank_host[1]
    links = good.of("detect.link")
    named = sorted(tuple(sorted(e["data"]["hosts"])) for e in links)
    others = sorted(h for h in rank_host.values() if h != hit)
    assert named == sorted(tuple(sorted((hit, o))) for o in others)  # both links of the node, not the third pair
    assert all(e["data"]["small_ok"] is True and e["data"]["large_ok"] is False for e in links)  # pings green
    [round_] = good.of("runner.link_probe")
    assert round_["data"]["pairs"] == 3 and round_["data"]["bad"] == 2 and round_["data"]["errors"] == []
    assert applied["ts_ns"] < hung[0]["ts_ns"] < links[0]["ts_ns"] < good.of("fault.healed")[0]["ts_ns"]
    assert good.checks["lost_work_at_most"]["measured"] in (0, 0.0)  # healed without a restart


def test_a_wrong_pair_fails_on_the_real_history(run: Run) -> None:
    rank_host = {e["rank"]: e["data"]["host"] for e in run.of("target.start")}
    scenario = load_scenario(SCENARIOS / f"{NAME}.yaml")
    [fault] = scenario.faults
    only_one = fault.params.model_copy(update={"peers": [f"host:{rank_host[2]}"]})  # hit only the rank-2 link
    moved = scenario.model_copy(update={"faults": [fault.model_copy(update={"params": only_one})]})
    result = _judged(run, moved)["link_named"]
    assert result.status == "fail" and "WRONG pair" in " ".join(result.evidence), result


def test_without_the_diagnosis_nothing_names_the_link_and_the_scenario_fails(run: Run) -> None:
    scenario = load_scenario(SCENARIOS / f"{NAME}.yaml")
    blind = _judged(run, scenario, without=("detect.hang", "detect.link", "runner.link_probe"))
    assert blind["link_named"].status == "unknown" and "no link probe ran" in blind["link_named"].reason
    assert blind["stalled_during"].status == "pass"  # the fault was real: the job stalled
    assert {r.status for c, r in blind.items() if c != "link_named"} == {"pass"}  # only the diagnosis is missing
    assert {r.status for r in _judged(run, scenario).values()} == {"pass"}


def test_nothing_is_left_on_any_host(testbed: Inventory, run: Run) -> None:
    assert not _leftovers(testbed, [run.run_dir])
