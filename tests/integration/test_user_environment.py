"""The user's environment: which interpreter and launcher run a job, and a golden cache that
an edited script, changed arguments or another interpreter never reuse.

Interpreters here are real: the system's ``/usr/bin/python3`` (no torch: as on a machine where mlchaos lives in
a venv that is not activated), and wrapper scripts around this venv's interpreter that leave a mark when they
run (a user's environment that has torch and mlchaos).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, scenario_yaml

from chaos.cluster.local import LocalTransport
from chaos.history.timeline import Event, History
from chaos.run.golden import code_fingerprint, golden_outcome
from chaos.run.orchestrator import RunOptions, execute
from chaos.spec.scenario import CommandTarget, Scenario, TorchrunTarget, load_scenario, parse_scenario
from chaos.targets import interpreter
from chaos.targets.command import CommandJob
from chaos.targets.torchrun import TorchrunJob

SYSTEM_PYTHON = "/usr/bin/python3"
LOCAL = LocalTransport()
VENV_BIN = Path(sys.executable).parent


def _torchrun(**fields: Any) -> TorchrunTarget:
    return TorchrunTarget.model_validate(
        {"type": "torchrun", "script": str(ROOT / "tests/jobs/user_ddp_adam.py"), **fields}
    )


def _wrapper(directory: Path, name: str = "python3", mark: Path | None = None) -> Path:
    """An interpreter of the user's: execs this venv's python, after noting its own use in ``mark``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    note = f'echo "$0 $*" >> {mark}\n' if mark is not None else ""
    path.write_text(f'#!/bin/sh\n{note}exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


def _only_on_path(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{directory}:/usr/bin:/bin")


def test_default_is_the_users_python3_when_it_can_run_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = _wrapper(tmp_path / "bin")
    _only_on_path(tmp_path / "bin", monkeypatch)
    chosen = interpreter.torchrun_python(_torchrun())
    assert chosen.command == str(user) and chosen.why == "python3 on PATH"
    job = TorchrunJob(_torchrun(), LOCAL, tmp_path, 1)
    assert job.job.argv[:3] == [str(user), "-m", "torch.distributed.run"]


def test_default_falls_back_to_mlchaos_interpreter_when_python3_lacks_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not os.path.exists(SYSTEM_PYTHON) or interpreter._can_import(SYSTEM_PYTHON, ("torch",), None):
        pytest.skip("needs a system python3 without torch")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(SYSTEM_PYTHON)
    _only_on_path(tmp_path / "bin", monkeypatch)
    chosen = interpreter.torchrun_python(_torchrun())
    assert chosen.command == sys.executable
    assert "cannot import" in chosen.why and "chaos.agent" in chosen.why and "torch" in chosen.why
    # A job that imports neither torch nor mlchaos runs with the user's python3 all the same.
    plain = tmp_path / "plain.py"
    plain.write_text("print('hello')\n")
    spec = CommandTarget(type="command", command=["{python}", str(plain)])
    assert interpreter.command_argv(spec, {}) == [str(tmp_path / "bin" / "python3"), str(plain)]


def test_explicit_python_and_torchrun_build_the_launch_line(tmp_path: Path) -> None:
    spec = _torchrun(python="/opt/env/bin/python")
    job = TorchrunJob(spec, LOCAL, tmp_path, 1)
    assert job.job.argv[:3] == ["/opt/env/bin/python", "-m", "torch.distributed.run"]
    assert "/opt/env/bin/python" in job.describe()

    spec = _torchrun(torchrun=["/opt/env/bin/torchrun"])
    argv = TorchrunJob(spec, LOCAL, tmp_path, 1).job.argv
    assert argv[0] == "/opt/env/bin/torchrun" and "--no-python" not in argv

    spec = _torchrun(torchrun=["/opt/env/bin/torchrun"], python="/opt/other/python")
    argv = TorchrunJob(spec, LOCAL, tmp_path, 1).job.argv
    assert argv[:2] == ["/opt/env/bin/torchrun", "--no-python"]
    script = str(ROOT / "tests/jobs/user_ddp_adam.py")
    assert argv[argv.index(script) - 1] == "/opt/other/python"  # torchrun runs "<python> <script>"

    spec = TorchrunTarget(type="torchrun", module="chaos.reference.trainer", torchrun=["tr"], python="py")
    argv = TorchrunJob(spec, LOCAL, tmp_path, 1).job.argv
    assert argv[-3:] == ["py", "-m", "chaos.reference.trainer"]


def test_command_python_replaces_a_bare_python_and_fills_the_placeholder(tmp_path: Path) -> None:
    spec = CommandTarget(type="command", command=["python3", "train.py", "--x", "{python}"], python="/env/python")
    job = CommandJob(spec, LOCAL, tmp_path, 1)
    assert job.job.argv == ["/env/python", "train.py", "--x", "/env/python"]
    as_written = CommandTarget(type="command", command=["python3", "train.py"])
    assert CommandJob(as_written, LOCAL, tmp_path, 1).job.argv == ["python3", "train.py"]
    other = CommandTarget(type="command", command=["/usr/bin/env", "python3"], python="/env/python")
    assert interpreter.command_argv(other, {}) == ["/usr/bin/env", "python3"]  # only the program is replaced


def test_python_and_torchrun_are_validated_in_the_scenario() -> None:
    base = "name: s\nchecks: [{type: completes}]\ntarget: {type: torchrun, script: a.py, %s}\n"
    parse_scenario(base % "python: /opt/env/bin/python, torchrun: [/opt/env/bin/torchrun]")
    with pytest.raises(Exception, match="torchrun"):
        parse_scenario(base % "torchrun: []")
    with pytest.raises(Exception, match="python"):
        parse_scenario(base % "python: ''")


# ---------------------------------------------------------------------------------------------------------
# The golden cache


def _scenario(tmp: Path, target: dict[str, Any]) -> Scenario:
    source = tmp / "s.yaml"
    source.write_text(scenario_yaml("s", 3, target, checks=[{"type": "matches_golden"}], safety={}))
    return load_scenario(source)


def _cache_name(scenario: Scenario) -> str:
    return f"{scenario.golden_key()}-{code_fingerprint(scenario)}"


def test_an_edited_torchrun_script_or_changed_args_never_reuse_a_golden(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nprint(1)\n")
    target = {"type": "torchrun", "script": str(script), "python": sys.executable, "args": ["--steps", 5]}
    first = _cache_name(_scenario(tmp_path, target))
    assert _cache_name(_scenario(tmp_path, target)) == first  # nothing changed: the same cache entry
    script.write_text("import torch\nprint(2)\n")
    edited = _cache_name(_scenario(tmp_path, target))
    assert edited != first
    assert _cache_name(_scenario(tmp_path, {**target, "args": ["--steps", 6]})) not in (first, edited)
    assert _cache_name(_scenario(tmp_path, {**target, "python": str(_wrapper(tmp_path / "b"))})) != edited


def test_a_command_targets_script_and_interpreter_are_fingerprinted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "job.py"
    script.write_text("print('a')\n")
    scenario = _scenario(tmp_path, {"type": "command", "command": ["{python}", str(script), "--n", 3]})
    _wrapper(tmp_path / "venv-env")  # python3 = this venv's interpreter
    _only_on_path(tmp_path / "venv-env", monkeypatch)
    before = code_fingerprint(scenario)
    script.write_text("print('b')\n")
    edited = code_fingerprint(scenario)
    assert edited != before  # the edited script: once ignored for command targets
    if not os.path.exists(SYSTEM_PYTHON):
        return
    # Another default interpreter (the user's python3 on PATH is now another Python), the scenario untouched.
    (tmp_path / "system-env").mkdir()
    (tmp_path / "system-env" / "python3").symlink_to(SYSTEM_PYTHON)
    _only_on_path(tmp_path / "system-env", monkeypatch)
    assert code_fingerprint(scenario) != edited


def test_golden_outcome_runs_again_after_the_script_is_edited(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("v = 1\n")
    scenario = _scenario(tmp_path, {"type": "command", "command": [sys.executable, str(script)]})
    runs: list[str] = []

    class Run:
        def __init__(self, digest: str) -> None:
            self.history = History.from_events([Event(ts_ns=1, kind="target.digest", rank=0, data={"digest": digest})])
            self.run_dir = tmp_path
            self.ended_by = "job exited"

    def run(_: Scenario, __: Path) -> Run:
        runs.append(script.read_text())
        return Run("d" * 64 if len(runs) == 1 else "e" * 64)

    cache = tmp_path / "cache"
    first = golden_outcome(scenario, cache, use_cache=True, run_fault_free=run, log=lambda _: None)
    again = golden_outcome(scenario, cache, use_cache=True, run_fault_free=run, log=lambda _: None)
    assert first is not None and again is not None and again.cached and len(runs) == 1
    script.write_text("v = 2\n")
    edited = golden_outcome(scenario, cache, use_cache=True, run_fault_free=run, log=lambda _: None)
    assert edited is not None and not edited.cached and len(runs) == 2 and edited.digest == "e" * 64


# ---------------------------------------------------------------------------------------------------------
# Real runs through the harness


def test_a_torchrun_job_runs_with_the_python_and_launcher_the_target_names(tmp_path: Path) -> None:
    mark = tmp_path / "used"
    python = _wrapper(tmp_path / "env", "python", mark=mark)
    launcher = VENV_BIN / "torchrun"
    job = ROOT / "tests" / "jobs" / "user_ddp_adam.py"
    target = {
        "type": "torchrun",
        "script": str(job),
        "nproc_per_node": 1,
        "max_restarts": 0,
        "args": ["--steps", 2],
        "python": str(python),
        "torchrun": [str(launcher)],
    }
    source = tmp_path / "t.yaml"
    source.write_text(
        scenario_yaml("user-env", 1, target, checks=[{"type": "completes"}], safety={"max_duration": "120s"})
    )
    result = execute(load_scenario(source), RunOptions(report_root=tmp_path / "reports", scenario_file=source))
    assert {r.check: r.status for r in result.results} == {"completes": "pass"}, result.results
    used = mark.read_text()
    assert str(job) in used, used  # torchrun (--no-python) started the worker with the user's interpreter
    assert result.history.of("target.step") and result.history.of("target.start")  # the agent line reported


def test_torchrun_keeps_its_log_directory_in_the_run_directory(tmp_path: Path) -> None:
    # Without --log-dir torchrun makes a /tmp/torchelastic_* directory at every launch and never removes it.
    argv = TorchrunJob(_torchrun(python=sys.executable), LOCAL, tmp_path, 1).job.argv
    assert argv[argv.index("--log-dir") + 1] == f"{tmp_path}/torchelastic"
    own = TorchrunJob(_torchrun(torchrun=["/opt/env/bin/torchrun", "--log-dir=/logs"]), LOCAL, tmp_path, 1).job.argv
    assert "--log-dir" not in own and own.count("--log-dir=/logs") == 1  # the user's own is kept, not doubled

    script = tmp_path / "one_rank.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'])\n")
    before = set(Path(tempfile.gettempdir()).glob("torchelastic_*"))
    job = TorchrunJob(
        TorchrunTarget(type="torchrun", script=str(script), nproc_per_node=1, python=sys.executable), LOCAL, tmp_path, 1
    )
    job.start()
    try:
        deadline = time.monotonic() + 120
        while job.exit_code() is None and time.monotonic() < deadline:
            job.poll_events()
            time.sleep(0.2)
        assert job.exit_code() == 0
    finally:
        job.stop()
    assert any((tmp_path / "torchelastic").iterdir())  # torchrun wrote its run's directory here
    assert set(Path(tempfile.gettempdir()).glob("torchelastic_*")) <= before
