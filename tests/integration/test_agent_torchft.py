"""The in-job agent on torchft: real torchft 0.2.0 replica groups (a lighthouse and two groups, each its own
torchrun with one gloo rank) of ``tests/jobs/user_torchft.py``, a job written like torchft's ``train_ddp.py``,
with the one-line tier's two edits (``import chaos.agent``; ``agent = chaos.agent.attach(model, optimizer,
manager=manager, ddp=ddp, guard=...)``) and nothing else: the loop is driven through torchft's commit vote.

- One launch, two planned faults on group 1 under the checksum guard: a bit flip in the bucket's send buffer at
  step 6 (``in_transit``: the corrupted sum reaches BOTH groups) and one in group 1's received result at step 10
  (``post_reduce``: only group 1's). Every group that received a corrupted sum says so (``detect.sdc``, reported
  to torchft's Manager), does not commit that step (``committed: false``), and training goes on: step 6 is redone
  by both, group 1 heals from group 0 after step 10, and both end with identical parameters. A group that did
  not receive a corrupted sum commits (group 0 at step 10).
- The same corruption without the guard is committed by both groups (the agent's injection is real, and only the
  guard keeps it out): the property the first test checks fails without it.
- Unit level: torchft's DDP without its Manager is refused at attach, saying what to pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from jobs.launch_torchft import launch_groups
from support import ROOT, attached_script
from torch import nn

import chaos.agent

pytest.importorskip("torchft", reason="torchft is not installed: pip install -e '.[torchft]' (scripts/setup.sh does)")

JOB = ROOT / "tests" / "jobs" / "user_torchft.py"
STEPS = 14


def one_line(tmp: Path, guard: str) -> str:
    """``user_torchft.py`` plus the one-line tier's edits, with ``guard``."""
    attach = f"chaos.agent.attach(model, optimizer, manager=manager, ddp=ddp, guard={guard!r})"
    out = tmp / f"user_torchft_{guard}.py"
    return str(attached_script(JOB, out, attach, after="optimizer = Optimizer(manager, inner)"))


def _sdc(step: int, site: str) -> dict[str, Any]:
    return {
        "op_id": f"sdc-{site}#1",
        "fault": f"sdc-{site}",
        "injector": "grad_corrupt",
        "at_step": step,
        "rank": 0,
        "params": {"site": site, "replica": "group.1", "rank": 0},
    }


def _steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["kind"] == "target.step"]


def _detections(events: list[dict[str, Any]]) -> list[int]:
    return [e["data"]["step"] for e in events if e["kind"] == "detect.sdc"]


def _uncommitted(events: list[dict[str, Any]]) -> list[int]:
    """The steps this group computed and did not commit (``step`` is torchft's step before them)."""
    return [s["step"] + 1 for s in _steps(events) if s["committed"] is False]


@pytest.mark.slow
def test_sdc_in_torchfts_allreduce_is_reported_to_torchft_and_the_step_is_not_committed(tmp_path: Path) -> None:
    ops = [_sdc(6, "in_transit"), _sdc(10, "post_reduce")]
    # min_replicas 2: every step is one reduction of both groups (a group that started late cannot train alone).
    group0, group1 = launch_groups(
        tmp_path / "ft", [one_line(tmp_path, "checksum"), "--steps", str(STEPS)], ops, min_replicas=2
    )
    for run in (group0, group1):
        assert run.code == 0, run.log[-3000:]
    fired = [(e["data"]["step"], e["data"]["site"]) for e in group1.events if e["kind"] == "fault.applied"]
    assert fired == [(6, "in_transit"), (10, "post_reduce")], group1.events
    assert not [e for e in group0.events if e["kind"] == "fault.applied"]  # the plan's replica filter
    # In transit: both groups received the corrupted sum, both detected it, reported it, and dropped step 6.
    assert _detections(group0.events) == [6], group0.events
    assert _detections(group1.events) == [6, 10], group1.events
    assert _uncommitted(group0.events) == [6], _steps(group0.events)
    assert _uncommitted(group1.events) == [6, 10], _steps(group1.events)
    sdc = next(e["data"] for e in group1.events if e["kind"] == "detect.sdc")
    assert sdc["action"] == "report" and sdc["via"] == "torchft.Manager.report_error", sdc
    assert sdc["participants"] == 2, sdc  # inside a reduction of both groups
    # Training went on: both redid step 6 and trained to the end; group 0 committed step 10, group 1 took it (and
    # the next step) from group 0 when it healed; the same final parameters.
    for run, redone in ((group0, {6, 10}), (group1, {6})):
        committed = [s["step"] for s in _steps(run.events) if s["committed"]]
        assert committed[-1] == STEPS and redone <= set(committed), committed
    [digest0] = [e["data"]["digest"] for e in group0.events if e["kind"] == "target.digest"]
    [digest1] = [e["data"]["digest"] for e in group1.events if e["kind"] == "target.digest"]
    assert digest0 == digest1


@pytest.mark.slow
def test_without_the_guard_the_corrupted_step_is_committed(tmp_path: Path) -> None:
    job = [one_line(tmp_path, "none"), "--steps", "8"]
    group0, group1 = launch_groups(tmp_path / "ft", job, [_sdc(6, "in_transit")], min_replicas=2)
    assert group0.code == 0 and group1.code == 0, group1.log[-3000:]
    assert [e["data"]["step"] for e in group1.events if e["kind"] == "fault.applied"] == [6]
    for run in (group0, group1):
        assert not _detections(run.events) and not _uncommitted(run.events), _steps(run.events)


def test_torchfts_ddp_without_its_manager_is_refused() -> None:
    class DistributedDataParallel(nn.Module):  # a stand-in for torchft's class: the agent knows it by its module
        __module__ = "torchft.ddp"

    with pytest.raises(ValueError, match="pass the Manager too: attach"):
        chaos.agent.attach(nn.Linear(2, 2), ddp=DistributedDataParallel())
