"""The zero-line step reporter (``chaos/injob/bootstrap/sitecustomize.py``) in real Python processes: a script
with no mlchaos line reports exact steps or none, stands down when the job reports for itself, and leaves the
interpreter's own sitecustomize running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.injob.bootstrap import BOOTSTRAP_DIR

SCRIPT = """
import os, torch
{imports}
model = torch.nn.Linear(2, 2)
opt = {optimizer}
if os.environ.get("RESUME"):
    state = torch.load(os.environ["CKPT"])
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
for _ in range(3):
    model(torch.ones(2)).sum().backward()
    opt.step()
torch.save({{"model": model.state_dict(), "optimizer": opt.state_dict()}}, os.environ["CKPT"])
"""


def run(tmp: Path, optimizer: str, *, resume: bool = False, imports: str = "", rank: str | None = "1") -> list[dict]:
    """Three optimizer steps in a fresh process (after loading ``tmp``'s checkpoint when ``resume``), then a save;
    the events the reporter wrote."""
    events = tmp / ("resumed.jsonl" if resume else "events.jsonl")
    env = {**os.environ, "CHAOS_EVENTS": str(events), "CKPT": str(tmp / "ck.pt"), "TORCHELASTIC_RESTART_COUNT": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), env.get("PYTHONPATH", "")])
    env.pop("RANK", None)
    if rank is not None:
        env["RANK"] = rank
    if resume:
        env["RESUME"] = "1"
    code = SCRIPT.format(optimizer=optimizer, imports=imports)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    return [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []


def steps(found: list[dict]) -> list[tuple[int | None, int, int]]:
    return [(e["rank"], e["data"]["step"], e["data"]["attempt"]) for e in found if e["kind"] == "target.step"]


def test_an_optimizer_with_its_own_count_reports_it_even_after_a_resume(tmp_path: Path) -> None:
    adam = "torch.optim.Adam(model.parameters())"
    assert steps(run(tmp_path, adam)) == [(1, 1, 2), (1, 2, 2), (1, 3, 2)]  # (rank, step, attempt)
    assert [step for _, step, _ in steps(run(tmp_path, adam, resume=True))] == [4, 5, 6]  # Adam's restored count


def test_an_optimizer_without_a_count_is_counted_only_on_a_fresh_start(tmp_path: Path) -> None:
    sgd = "torch.optim.SGD(model.parameters(), lr=0.1)"
    assert [step for _, step, _ in steps(run(tmp_path, sgd))] == [1, 2, 3]
    found = run(tmp_path, sgd, resume=True)
    assert steps(found) == []  # a count from 1 after a resume would be a wrong step: none is reported
    [said] = [e for e in found if e["kind"] == "target.step_source"]
    assert said["data"]["exact"] is False and "chaos.agent.attach(model, optimizer)" in said["data"]["reason"]


@pytest.mark.parametrize(
    ("imports", "rank"),
    [("import chaos.events", "1"), ("", None)],
    ids=["the job reports for itself", "not a rank process"],
)
def test_it_stands_down(tmp_path: Path, imports: str, rank: str | None) -> None:
    assert run(tmp_path, "torch.optim.SGD(model.parameters(), lr=0.1)", imports=imports, rank=rank) == []


def test_the_interpreters_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS_RAN = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), str(theirs)])}
    out = subprocess.run(
        [sys.executable, "-c", "import builtins; print(getattr(builtins, 'THEIRS_RAN', False))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "True"
