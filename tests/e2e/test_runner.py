"""The runner's guard rails, on real processes: interrupted runs heal, stalled runs end with `no progress`,
unsupported faults are refused before anything is applied, --repeat reports pass rates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from support import ROOT, RefusingInjector, mlchaos, scenario_yaml, ticker, wait_for

from chaos.cluster.local import process_state
from chaos.history.timeline import FAULT_APPLIED, FAULT_HEALED
from chaos.plugins import registry
from chaos.plugins.injector import Applied, FaultOp, InjectionContext
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import EXIT_FAIL, EXIT_HARNESS, EXIT_INVALID, EXIT_PASS
from chaos.spec.scenario import parse_scenario


def _ticker(
    name: str, faults: str = "[]", checks: str = "[]", ticks: int = 30, tail: float = 0, no_progress: str = "30s"
) -> str:
    """A ticking scenario; ``faults`` and ``checks`` are YAML list text, as a scenario file spells them."""
    return scenario_yaml(
        name,
        3,
        ticker(ticks, then=f"time.sleep({tail})"),
        faults=yaml.safe_load(faults),
        checks=yaml.safe_load(checks),
        safety={"no_progress_timeout": no_progress, "max_duration": "60s"},
    )


def test_sigterm_to_the_harness_heals_at_once_and_exits_3(tmp_path: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        scenario = tmp_path / "s.yaml"
        faults = f"  - {{type: freeze, params: {{pid: {victim.pid}}}, trigger: {{after: 0.5s}}, duration: 60s}}"
        scenario.write_text(_ticker("interrupted", faults=faults, ticks=600))
        harness = subprocess.Popen(
            [sys.executable, "-m", "chaos.cli.commands", "run", str(scenario), "--report-dir", str(tmp_path)],
            cwd=ROOT,
            env={"MLCHAOS_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert wait_for(lambda: process_state(victim.pid) == "T", 60)
        harness.send_signal(signal.SIGTERM)
        output, _ = harness.communicate(timeout=60)
        assert harness.returncode == EXIT_HARNESS, output
        assert process_state(victim.pid) not in ("T", None), "the freeze outlived the interrupted harness"
        [run_json] = tmp_path.glob("interrupted-*/run.json")
        document = json.loads(run_json.read_text())
        assert document["verdict"] == "error" and document["ended_by"] == "interrupted"
        kinds = [e["kind"] for e in document["events"]]
        assert kinds.index(FAULT_APPLIED) < kinds.index(FAULT_HEALED)
    finally:
        victim.send_signal(signal.SIGCONT)
        victim.kill()
        victim.wait(timeout=10)


def test_a_stalled_target_ends_with_no_progress_and_is_stopped(tmp_path: Path) -> None:
    scenario = parse_scenario(_ticker("stalled", ticks=5, tail=300, no_progress="2s", checks="  - type: completes"))
    started = time.monotonic()
    result = execute(scenario, RunOptions(report_root=tmp_path))
    assert time.monotonic() - started < 45, "the watchdog did not end the run"
    assert result.ended_by.startswith("no progress")
    assert result.exit_code == EXIT_FAIL
    assert any(r.check == "progress" and r.status == "fail" for r in result.results)
    assert result.history.of("runner.no_progress")
    assert result.history.of("target.exit"), "the stalled target was not stopped"


def test_an_unsupported_fault_is_refused_before_the_target_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = tmp_path / "target-started"
    scenario = parse_scenario(
        _ticker("refused", faults="  - {type: kill, params: {pid: 4242}, trigger: {after: 1s}}").replace(
            "import time", f"import time, pathlib; pathlib.Path('{started}').touch()"
        )
    )
    monkeypatch.setattr(registry, "injectors", lambda: {"kill": RefusingInjector})
    result = execute(scenario, RunOptions(report_root=tmp_path))
    assert result.exit_code == EXIT_INVALID
    assert "not supported here: this kernel lacks the feature" in result.error
    assert not started.exists() and not result.history.of(FAULT_APPLIED)


def test_repeat_reports_a_pass_rate_per_check(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(_ticker("repeated", ticks=5, checks="  - type: completes"))
    proc = mlchaos("run", scenario, "--repeat", "2", "--report-dir", tmp_path, timeout=120)
    assert proc.returncode == EXIT_PASS, proc.stdout + proc.stderr
    assert "pass rate over 2 runs" in proc.stdout and "2/2 (100%)" in proc.stdout
    assert len(list(tmp_path.glob("repeated-*/run.json"))) == 2


def test_a_finished_run_leaves_no_open_journal(tmp_path: Path) -> None:
    from chaos.safety.journal import all_journals

    victim = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        faults = f"  - {{type: freeze, params: {{pid: {victim.pid}}}, trigger: {{after: 0.2s}}, duration: 0.5s}}"
        checks = "  - {type: recovered_within, params: {fault: freeze-1, within: 10s}}"
        result = execute(
            parse_scenario(_ticker("archived", faults=faults, checks=checks, ticks=20)),
            RunOptions(report_root=tmp_path),
        )
        assert result.exit_code == EXIT_PASS, result.results
        assert all(result.run_dir.name not in p.name for p in all_journals()), "journal not archived"
        assert process_state(victim.pid) not in ("T", None)
    finally:
        victim.kill()
        victim.wait(timeout=10)


def test_heal_all_also_heals_a_journaled_fault_that_never_became_active(tmp_path: Path) -> None:
    """A signal can land between a fault's apply and its registration as active: the journal still heals it."""
    from chaos.cluster.hosts import HostSet
    from chaos.history.timeline import History
    from chaos.plan.build import make_plan
    from chaos.plugins.injector import InjectionContext
    from chaos.run.orchestrator import Execution
    from injectors.process.faults import FreezeInjector, FreezeParams

    victim = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        scenario = parse_scenario(_ticker("orphan-fault", ticks=1))
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        history = History(run_dir / "history.jsonl")
        execution = Execution(
            scenario,
            make_plan(scenario),
            run_dir,
            history,
            lambda _: None,
            lambda _: None,
            HostSet(None, [], None),
        )
        injector = FreezeInjector()
        op = FaultOp(
            op_id="orphan#1", fault="orphan", injector="freeze", params=FreezeParams(pid=victim.pid), duration_s=60
        )
        ctx = InjectionContext(execution.transport)
        applied = injector.prepare(ctx, op)
        execution.journal.intent(applied)
        injector.apply(ctx, applied)  # ...and the harness is "interrupted" before recording it as active
        assert wait_for(lambda: process_state(victim.pid) == "T", 10)
        assert execution.heal_all() == []
        assert wait_for(lambda: process_state(victim.pid) not in ("T", None), 10)
        assert execution.journal.unhealed() == []
        execution.journal.archive()
    finally:
        victim.send_signal(signal.SIGCONT)
        victim.kill()
        victim.wait(timeout=10)


@contextmanager
def _sleepers(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` idle processes to freeze, resumed and killed on exit whatever happened."""
    victims = [
        subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]) for _ in range(count)
    ]
    try:
        yield victims
    finally:
        for victim in victims:
            victim.send_signal(signal.SIGCONT)
            victim.kill()
            victim.wait(timeout=10)


def test_a_signal_landing_mid_apply_waits_until_the_fault_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM arriving while a fault is being applied (here: sent by the apply itself, right after the real
    SIGSTOP) is held until the fault is recorded and registered, then interrupts the run: the history shows the
    fault applied and then healed, never a heal of a fault it did not record (a clean make test once caught
    exactly that: fault.healed with no fault.applied)."""
    from injectors.process.faults import FreezeInjector

    real_apply = FreezeInjector.apply

    def apply_then_signalled(self: FreezeInjector, ctx: InjectionContext, applied: Applied) -> None:
        real_apply(self, ctx, applied)
        os.kill(os.getpid(), signal.SIGTERM)  # the signal lands inside the apply
        time.sleep(0.2)  # time for the handler to run here, mid-apply

    monkeypatch.setattr(FreezeInjector, "apply", apply_then_signalled)
    with _sleepers(1) as [victim]:
        faults = f"  - {{type: freeze, params: {{pid: {victim.pid}}}, trigger: {{after: 0.5s}}, duration: 60s}}"
        result = execute(
            parse_scenario(_ticker("mid-apply", faults=faults, ticks=600)), RunOptions(report_root=tmp_path)
        )
        assert result.ended_by == "interrupted" and result.exit_code == EXIT_HARNESS, result.error
        kinds = [e.kind for e in result.history.events]
        assert FAULT_APPLIED in kinds, kinds
        assert kinds.index(FAULT_APPLIED) < kinds.index(FAULT_HEALED), kinds
        assert process_state(victim.pid) not in ("T", None), "the freeze outlived the interrupted run"


def test_a_second_signal_while_healing_waits_until_every_fault_is_healed_and_the_job_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM interrupts a run holding two freezes; a SIGINT arriving while the first of them heals (sent by
    the heal itself) must not cut the healing short: both victims resume and the job is stopped, then the run
    ends interrupted."""
    from injectors.process.faults import FreezeInjector

    real_apply, real_heal = FreezeInjector.apply, FreezeInjector.heal
    calls = {"apply": 0, "heal": 0}

    def apply(self: FreezeInjector, ctx: InjectionContext, applied: Applied) -> None:
        real_apply(self, ctx, applied)
        calls["apply"] += 1
        if calls["apply"] == 2:  # both frozen: interrupt the run
            os.kill(os.getpid(), signal.SIGTERM)

    def heal(self: FreezeInjector, ctx: InjectionContext, applied: Applied) -> None:
        real_heal(self, ctx, applied)
        calls["heal"] += 1
        if calls["heal"] == 1:  # the second signal, with one freeze still to heal
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)

    monkeypatch.setattr(FreezeInjector, "apply", apply)
    monkeypatch.setattr(FreezeInjector, "heal", heal)
    with _sleepers(2) as victims:
        faults = "\n".join(
            f"  - {{type: freeze, params: {{pid: {v.pid}}}, trigger: {{after: {0.5 + i}s}}, duration: 60s}}"
            for i, v in enumerate(victims)
        )
        result = execute(
            parse_scenario(_ticker("two-heals", faults=faults, ticks=600)), RunOptions(report_root=tmp_path)
        )
        assert result.ended_by == "interrupted" and result.exit_code == EXIT_HARNESS, result.error
        assert calls["heal"] == 2, calls
        assert all(process_state(v.pid) not in ("T", None) for v in victims), "a freeze outlived the second signal"
        kinds = [e.kind for e in result.history.events]
        assert kinds.count(FAULT_HEALED) == 2 and "runner.stop" in kinds, kinds


def test_a_slow_start_is_not_a_stall_but_silence_after_it_is(tmp_path: Path) -> None:
    """Before the first step, a rank's start counts as progress: a job that starts 2 s in and steps 2.5 s later
    runs to its end under a 4 s no-progress timeout (a run measured from its own start would have ended at 4 s,
    with no step yet); the timeout still ends a job that started and then never steps."""
    matchers = [
        {"pattern": r"^started", "event": "target.start"},
        {"pattern": r"tick (?P<step>\d+)", "event": "target.step"},
    ]

    def scenario(name: str, code: str) -> str:
        target = {"type": "command", "command": [sys.executable, "-c", code], "matchers": matchers}
        return scenario_yaml(
            name, 3, target, checks=[{"type": "completes"}], safety={"no_progress_timeout": "4s", "max_duration": "60s"}
        )

    slow = "import time\ntime.sleep(2); print('started', flush=True); time.sleep(2.5)\n"
    slow += "for i in range(5): print('tick', i, flush=True); time.sleep(0.1)"
    result = execute(parse_scenario(scenario("slow-start", slow)), RunOptions(report_root=tmp_path))
    assert result.ended_by.startswith("target exited"), result.ended_by
    assert result.exit_code == EXIT_PASS
    silent = "import time\nprint('started', flush=True); time.sleep(300)"
    result = execute(parse_scenario(scenario("started-then-silent", silent)), RunOptions(report_root=tmp_path))
    assert result.ended_by.startswith("no progress"), result.ended_by


def test_a_faults_time_is_taken_before_its_signal_is_sent(tmp_path: Path) -> None:
    """The job stamps the SIGTERM it receives with its own clock; the run's ``fault.applied`` is not later than
    that (it was stamped after the signal went out, which a fast job beat: a check splitting time at the fault
    then counted the job's reaction as "before"), and says how long the apply took."""
    code = (
        "import signal, sys, time\nfrom chaos import events  # stamp-before-signal\n"
        "def on_term(signum, frame):\n    events.emit('job.sigterm', rank=0)\n    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "for i in range(100): print('tick', i, flush=True); time.sleep(0.1)\n"
    )
    target = {
        "type": "command",
        "command": [sys.executable, "-c", code],
        "matchers": [{"pattern": r"tick (?P<step>\d+)", "event": "target.step"}],
    }
    fault = {
        "name": "term",
        "type": "kill",
        "params": {"name": "stamp-before-signal", "signal": "SIGTERM"},
        "trigger": {"at_step": 5},
    }
    text = scenario_yaml("stamp", 3, target, faults=[fault], safety={"max_duration": "60s"})
    result = execute(parse_scenario(text), RunOptions(report_root=tmp_path))
    [applied] = result.history.of(FAULT_APPLIED)
    [received] = result.history.of("job.sigterm")
    assert applied.ts_ns <= received.ts_ns, (applied.ts_ns - received.ts_ns) / 1e6
    apply_s = applied.data.get("apply_s")
    assert isinstance(apply_s, float) and apply_s >= 0, applied.data
