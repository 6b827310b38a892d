"""What users write against mlchaos (the public surface) works as they run it.

- a training script of the user's own that imports only ``chaos.agent``, run as its own process, gets a planned
  bit flip fired into its real weights and healed, with no deprecation noise;
- a user's plugin package that registers an injector and a check through the entry-point groups is found by the
  registry and by ``mlchaos list`` / ``mlchaos validate``;
- the module paths users import (``chaos.spec.scenario``, ``chaos.plugins.injector``, ...) import without a warning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import IN_JOB_SURFACE

from chaos.plan.agent_plan import InJobOp, write_plan

USER_SCRIPT = """\
import torch
import chaos.agent

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
agent = chaos.agent.attach(model, optimizer=optimizer)
x, y = torch.randn(32, 8), torch.randn(32, 1)
try:
    for step in range(1, 6):
        agent.begin_step(step)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        agent.after_backward(loss)
        if agent.allow_optimizer_step():
            optimizer.step()
        agent.end_step()
finally:
    agent.close()
print("user script done")
"""


def test_a_users_script_importing_only_chaos_agent_gets_its_fault_fired_and_healed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    plan, events = tmp_path / "plan.json", tmp_path / "events.jsonl"
    flip = {"where": "weights", "layer": "0.weight", "kind": "bitflip", "element": 3, "bit": 30}
    write_plan(plan, 7, [InJobOp(op_id="op-1", fault="flip", injector="bitflip", params=flip, at_step=3, rank=0)])
    env = {**os.environ, "CHAOS_PLAN": str(plan), "CHAOS_EVENTS": str(events), "RANK": "0", "WORLD_SIZE": "1"}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-W", "default", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "user script done" in done.stdout
    assert "moved to" not in done.stderr, "the public chaos.agent path must not warn"
    kinds = [json.loads(line)["kind"] for line in events.read_text().splitlines() if line.strip()]
    assert "fault.applied" in kinds and "fault.healed" in kinds, kinds


PLUGIN = '''\
"""A user's fault family, written against the documented paths (chaos.plugins.injector, chaos.checks.base)."""
from typing import ClassVar
from pydantic import BaseModel, ConfigDict
from chaos.plugins.injector import Applied, FaultOp, InjectionContext
from chaos.checks.base import CheckResult, register_check


class NoteParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    text: str = "hello"


class NoteInjector:
    """Writes nothing anywhere: a fault that only records itself (enough to prove discovery)."""
    name: ClassVar[str] = "user_note"
    summary: ClassVar[str] = "records a note (a user's plugin)"
    Params: ClassVar[type[BaseModel]] = NoteParams
    revert_on_harness: ClassVar[bool] = False

    def check(self, ctx: InjectionContext, params: BaseModel) -> None:
        return None

    def prepare(self, ctx: InjectionContext, op: FaultOp) -> Applied:
        return Applied(op_id=op.op_id, fault=op.fault, injector=self.name, duration_s=op.duration_s)

    def apply(self, ctx: InjectionContext, applied: Applied) -> None:
        return None

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        return None

    def revert_command(self, applied: Applied) -> list[str] | None:
        return None


class AlwaysParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@register_check("user_always_unknown", AlwaysParams, summary="a user's check: always unknown")
def always_unknown(history, params, scenario) -> CheckResult:
    return CheckResult(check="user_always_unknown", name="user_always_unknown", status="unknown", reason="no evidence")
'''


def _install_plugin(site: Path, module_text: str) -> None:
    """A real installed distribution (dist-info with entry_points.txt) on a path the child python reads."""
    (site / "userplug.py").write_text(module_text)
    dist = site / "userplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: userplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[mlchaos.injectors]\nuser_note = userplug:NoteInjector\n\n[mlchaos.checks]\nuserplug = userplug\n"
    )


SCENARIO = """\
name: user-plugin
target: {type: command, command: ["sleep", "1"]}
faults:
  - name: note
    type: user_note
    trigger: {after: 0.1s}
    params: {text: hi}
checks:
  - {type: user_always_unknown}
"""


def test_a_users_entry_point_plugin_is_found_and_validates(tmp_path: Path) -> None:
    _install_plugin(tmp_path, PLUGIN)
    scenario = tmp_path / "user.yaml"
    scenario.write_text(SCENARIO)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    cli = [sys.executable, "-m", "chaos.cli"]
    listed = subprocess.run([*cli, "list"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "user_note" in listed.stdout and "user_always_unknown" in listed.stdout
    valid = subprocess.run([*cli, "validate", str(scenario)], env=env, capture_output=True, text=True, timeout=120)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    bad = scenario.with_name("bad.yaml")
    bad.write_text(SCENARIO.replace("{text: hi}", "{text: hi, loud: true}"))
    refused = subprocess.run([*cli, "validate", str(bad)], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "loud" in refused.stdout + refused.stderr, "the plugin's Params is its schema"


@pytest.mark.parametrize(
    "statement",
    [
        "from chaos.run.orchestrator import execute",
        "from chaos.spec.scenario import load_scenario",
        "from chaos.plan.build import make_plan",
        "from chaos.safety.journal import Journal",
        "from chaos.injob.bitflip import flip_bits",
        "from chaos.plugins.injector import Applied, FaultOp, InjectionContext",
        "from chaos.checks.base import CheckResult, register_check",
        "from chaos.reference.serving.gateway import main",
        "from chaos.checks.serving.windows import resolve_window",
    ],
)
def test_the_public_module_paths_import_without_a_warning(statement: str) -> None:
    code = textwrap.dedent(f"""
        import warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            {statement}
        noise = [str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
        assert not noise, noise
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


AGENT_IMPORT = """
import json, sys
import torch, torch.distributed, torch.nn.parallel, torch.utils.data
before, hooks = set(sys.modules), (list(sys.meta_path), list(sys.path_hooks))
import chaos.agent, chaos.events, chaos.plan.agent_plan
new = sorted(set(sys.modules) - before)
print(json.dumps({"modules": new, "hooks_changed": hooks != (list(sys.meta_path), list(sys.path_hooks))}))
"""


def test_import_chaos_agent_loads_torch_the_standard_library_and_its_own_modules_only_and_no_import_hook() -> None:
    done = subprocess.run([sys.executable, "-c", AGENT_IMPORT], capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(done.stdout)
    loaded: list[str] = found["modules"]
    assert found["hooks_changed"] is False, "import chaos.agent changed sys.meta_path or sys.path_hooks"
    stdlib = sys.stdlib_module_names
    foreign = sorted(
        {m.split(".")[0] for m in loaded} - set(stdlib) - {"torch", "chaos", "_sysconfigdata__linux_x86_64-linux-gnu"}
    )
    assert foreign == [], f"import chaos.agent loads {foreign}: a training image would need them"
    harness = [m for m in loaded if m.startswith("chaos.") and m != "chaos.plan" and not m.startswith(IN_JOB_SURFACE)]
    assert harness == [], harness


# torch runs without numpy (it warns once); so must the agent: a planned flip fired and healed, steps and the digest
# reported, in a process where numpy cannot be imported.
WITHOUT_NUMPY = """
import json, os, sys
sys.modules["numpy"] = None  # import numpy now raises ImportError, as where it is not installed
import torch
from torch import nn
import chaos.agent
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
agent = chaos.agent.attach(model, optimizer=optimizer)
for step in range(1, 4):
    agent.begin_step(step)
    loss = model(torch.ones(4)).sum()
    loss.backward()
    agent.after_backward(loss)
    if agent.allow_optimizer_step():
        optimizer.step()
    optimizer.zero_grad()
    agent.end_step()
agent.close()
"""


def test_the_agent_fires_heals_and_reports_without_numpy(tmp_path: Path) -> None:
    plan = {
        "seed": 3,
        "ops": [
            {
                "op_id": "flip#1",
                "fault": "flip",
                "injector": "bitflip",
                "at_step": 2,
                "rank": 0,
                "params": {"where": "weights", "bit": 30},
            }
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    events = tmp_path / "events.jsonl"
    env = {**os.environ, "CHAOS_PLAN": str(tmp_path / "plan.json"), "CHAOS_EVENTS": str(events)}
    subprocess.run([sys.executable, "-c", WITHOUT_NUMPY], env=env, check=True, timeout=120, capture_output=True)
    kinds = [json.loads(line)["kind"] for line in events.read_text().splitlines()]
    assert kinds == [
        "target.start",
        "target.step",
        "fault.applied",
        "fault.healed",
        "target.step",
        "target.step",
        "target.digest",
    ], kinds
