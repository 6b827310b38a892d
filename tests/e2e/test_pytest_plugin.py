"""The pytest plugin, loaded through its ``pytest11`` entry point in a pytest SUBPROCESS (pytester): scenario
files as test items (per-check lines, JUnit properties, file:line errors), unrelated YAML left alone,
``chaos_run`` with overrides and setting precedence, and ``chaos_inject`` applying and undoing real faults.

Scenarios here are fast ``command`` targets: a Python ticker that reports a stall it notices (a freeze of
itself, selected by its unique ``{run_dir}`` argument) as ``detect.stall``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from chaos.cluster.local import process_state
from chaos.pytest_plugin.run import SessionLayers, run_settings
from chaos.pytest_plugin.support import OverrideError, apply_overrides, looks_like_scenario, parse_seed, resolve

pytest_plugins = ["pytester"]

# The target: ticks every 50 ms; a gap over 0.5 s (it was frozen) is printed as a detection.
TICKER = """\
import sys, time
last = time.monotonic()
for i in range({ticks}):
    now = time.monotonic()
    if now - last > 0.5:
        print('stall detected', flush=True)
    last = now
    print('tick', i, flush=True)
    time.sleep(0.05)
sys.exit({code})
"""


def scenario_yaml(
    name: str, *, within: str = "10s", code: int = 0, ticks: int = 30, fault: bool = True, host: str | None = None
) -> str:
    """A scenario whose ``pause`` fault freezes the ticker for 1 s (``fault=False``: no fault, only completes),
    applied from inventory host ``host`` (over SSH) when given."""
    script = json.dumps(TICKER.format(ticks=ticks, code=code))  # a JSON string is a valid YAML scalar
    faults = """\
faults:
  - name: pause
    type: freeze
    params: {name: "{run_dir}"}
    trigger: {after: 0.5s}
    duration: 1s
"""
    if host is not None:
        faults += f"    hosts: {{host: {host}}}\n"
    checks = "checks:\n"
    if fault:
        checks += f"  - type: detected_within\n    params: {{fault: pause, within: {within}}}\n"
    checks += "  - type: completes\n"
    return (
        f"name: {name}\nseed: 3\ntarget:\n  type: command\n"
        f'  command: [{json.dumps(sys.executable)}, -c, {script}, "{{run_dir}}"]\n'
        "  matchers:\n"
        "    - {pattern: 'tick (?P<step>\\d+)', event: target.step}\n"
        "    - {pattern: 'stall detected', event: detect.stall}\n"
        + (faults if fault else "")
        + checks
        + "safety: {max_duration: 30s, no_progress_timeout: 10s}\n"
    )


def junit_cases(path: Path) -> dict[str, ET.Element]:
    return {case.attrib["name"]: case for case in ET.parse(path).getroot().iter("testcase")}


def properties(case: ET.Element) -> dict[str, str]:
    return {p.attrib["name"]: p.attrib["value"] for p in case.iter("property")}


# -- pure parts ---------------------------------------------------------------------------------------------------


def test_resolve_takes_the_highest_layer_that_is_set() -> None:
    assert resolve({"ini": 1, "env": 2, "option": 3, "marker": 4}).value == 4
    assert resolve({"ini": 1, "env": 2, "option": 3}).source == "option"
    assert resolve({"ini": 1, "env": 2}).source == "env"
    assert resolve({"ini": 1, "scenario": 9}).source == "ini"
    assert resolve({"call": 0, "marker": 4}).value == 0  # 0 is a seed, not "unset"
    assert resolve({"marker": None, "default": 5}).source == "default"
    assert resolve({}).value is None and resolve({}).source is None


def test_run_settings_precedence_marker_option_env_ini() -> None:
    layers = SessionLayers(
        report_dir={"env": Path("/e"), "default": Path("/d")},
        inventory={"ini": Path("/i.yaml")},
        seed={"option": 3, "env": 2, "ini": 1},
    )
    plain = run_settings(layers)
    assert (plain.seed.value, plain.seed.source) == (3, "option")
    assert plain.report_dir.value == Path("/e") and plain.inventory.source == "ini"
    marked = run_settings(layers, marker={"seed": 4, "report_dir": Path("/m")})
    assert (marked.seed.value, marked.report_dir.value) == (4, Path("/m"))
    called = run_settings(layers, call={"seed": 5}, marker={"seed": 4})
    assert called.seed.source == "call" and called.seed.value == 5
    nothing = run_settings(SessionLayers(report_dir={}, inventory={}, seed={}))
    assert nothing.seed.value is None  # the scenario's own seed applies


def test_parse_seed() -> None:
    assert parse_seed("42", "X") == 42 and parse_seed(" ", "X") is None and parse_seed(None, "X") is None
    with pytest.raises(ValueError, match="MLCHAOS_SEED='abc' is not an integer"):
        parse_seed("abc", "MLCHAOS_SEED")


def test_overrides_merge_deep_and_select_faults_and_checks_by_name() -> None:
    data: dict[str, object] = {
        "name": "s",
        "target": {"type": "command", "command": ["a"], "env": {"A": "1"}},
        "faults": [
            {"type": "kill", "params": {"pid": 5}, "trigger": {"after": 1}},
            {"name": "f", "type": "freeze", "params": {"pid": 6}, "trigger": {"after": 2}, "duration": 3},
        ],
        "checks": [{"type": "completes"}, {"type": "detected_within", "params": {"fault": "f", "within": 5}}],
    }
    snapshot = json.dumps(data)
    merged = apply_overrides(
        data,
        {
            "target": {"command": ["b", "c"], "env": {"B": "2"}},
            "faults": {"kill-1": {"params": {"signal": "SIGTERM"}}, "f": None},
            "checks": {"detected_within": {"params": {"within": "1s"}}},
            "safety": {"no_progress_timeout": None},
        },
    )
    assert merged["target"] == {"type": "command", "command": ["b", "c"], "env": {"A": "1", "B": "2"}}
    assert merged["faults"] == [{"type": "kill", "params": {"pid": 5, "signal": "SIGTERM"}, "trigger": {"after": 1}}]
    assert merged["checks"] == [
        {"type": "completes"},
        {"type": "detected_within", "params": {"fault": "f", "within": "1s"}},
    ]
    assert merged["safety"] == {"no_progress_timeout": None}
    assert json.dumps(data) == snapshot  # the input is untouched
    assert apply_overrides(data, {"faults": []})["faults"] == []  # a list replaces
    with pytest.raises(OverrideError, match="no such fault .*kill-1, f"):
        apply_overrides(data, {"faults": {"nope": {"duration": 1}}})


def test_scenario_sniffing(tmp_path: Path) -> None:
    cases = {
        "scenario.yaml": "name: x\ntarget: {type: command, command: [true]}\n",
        "broken.yaml": "name: x\ntarget:\n  type: [unclosed\n",  # a syntax error still counts
        "ci.yaml": "name: CI\non: push\njobs: {}\n",
        "compose.yml": "services: {web: {image: nginx}}\n",
        "list.yaml": "- name: x\n  target: y\n",
    }
    for file, text in cases.items():
        (tmp_path / file).write_text(text)
    found = {file for file in cases if looks_like_scenario(tmp_path / file)}
    assert found == {"scenario.yaml", "broken.yaml"}


# -- scenario files as items --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_scenario_file_runs_as_an_item_with_check_lines_and_junit_properties(pytester: pytest.Pytester) -> None:
    scenarios = pytester.mkdir("scenarios")
    (scenarios / "stall.yaml").write_text(scenario_yaml("stall-detect"))
    (scenarios / "ci.yaml").write_text("name: CI\non: [push]\njobs: {build: {runs-on: ubuntu-latest}}\n")
    # A plugin option's value that names an existing file elsewhere moves pytest's rootdir to the common
    # ancestor when there is no ini file (pytest reads it before plugin options exist); the reports must still
    # land where pytest was run, not in that ancestor.
    elsewhere = pytester.path.parent / f"{pytester.path.name}-inventory" / "inventory.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text("hosts:\n- {name: h1, address: 127.0.0.1}\n")
    result = pytester.runpytest_subprocess(
        "scenarios", "--junitxml=junit.xml", "-p", "no:cacheprovider", "--chaos-inventory", str(elsewhere)
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*mlchaos checks*",
            "*scenarios/stall.yaml::stall-detect: PASS (seed 3*",
            "*PASS*detected_within[[]pause[]]  measured=1.*s  bound=<= 10s",
            "*PASS*completes  measured=0  bound=== 0",
            "*run dir: *reports/stall-detect-*",
        ]
    )
    cases = junit_cases(pytester.path / "junit.xml")
    assert list(cases) == ["stall-detect"]  # the CI config was not collected
    props = properties(cases["stall-detect"])
    assert props["check:detected_within[pause]"].startswith("pass measured=1.")
    assert props["check:detected_within[pause]"].endswith("bound=<= 10s")
    assert props["check:completes"] == "pass measured=0 bound=== 0"
    assert props["mlchaos:verdict"] == "pass" and props["mlchaos:seed"] == "3"
    run_dir = Path(props["mlchaos:run_dir"])
    assert run_dir.parent == pytester.path / "reports" and (run_dir / "run.json").exists()


@pytest.mark.slow
def test_failing_checks_show_measured_value_and_bound(pytester: pytest.Pytester) -> None:
    # The detection comes ~1 s after the freeze (bound 50 ms), and the job exits 3 (bound == 0).
    pytester.makefile(".yaml", late=scenario_yaml("late", within="50ms", code=3))
    result = pytester.runpytest_subprocess("late.yaml", "--junitxml=junit.xml", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*mlchaos scenario 'late': verdict fail (exit 1)*",
            "*FAIL*detected_within[[]pause[]]  measured=1.*s  bound=<= 0.05s*",
            "*FAIL*completes  measured=3  bound=== 0  (the job failed with code 3 after fault(s) pause (+*s) were applied: it did not recover from them)",
            "run dir: */reports/late-*",
        ]
    )
    case = junit_cases(pytester.path / "junit.xml")["late"]
    failure = case.find("failure")
    assert failure is not None and "bound=<= 0.05s" in (failure.text or "") and "measured=3" in (failure.text or "")
    props = properties(case)
    assert props["check:completes"].startswith(
        "fail measured=3 bound=== 0 reason=the job failed with code 3 after fault(s) pause"
    )
    assert props["check:detected_within[pause]"].startswith("fail measured=1.")
    assert props["mlchaos:verdict"] == "fail"


def test_malformed_scenarios_fail_with_file_and_line(pytester: pytest.Pytester) -> None:
    good = scenario_yaml("typo", fault=True)
    pytester.makefile(".yaml", typo=good.replace("trigger: {after", "triger: {after"))
    pytester.makefile(".yml", syntax="name: broken\ntarget:\n  type: command\n  command: [python, -c\n")
    result = pytester.runpytest_subprocess("typo.yaml", "syntax.yml", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)  # failed items, not collection errors
    result.stdout.fnmatch_lines_random(
        [
            "*typo.yaml:1?:5: unknown key 'triger' in faults.0*",
            "*fix: did you mean 'trigger'?",
            "*syntax.yml:*: YAML syntax*",
        ]
    )


def test_a_scenario_needing_hosts_skips_with_the_fix_when_no_inventory_is_given(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `pytest scenarios/` on a laptop: the multi-node scenarios cannot run there, and must say how to make them.
    monkeypatch.delenv("MLCHAOS_INVENTORY", raising=False)
    pytester.makefile(".yaml", remote=scenario_yaml("remote", host="h2"))
    result = pytester.runpytest_subprocess("remote.yaml", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*remote runs on inventory hosts and no inventory was given: pass --chaos-inventory=FILE*"]
    )
    assert not (pytester.path / "reports").exists()  # nothing ran, nothing was written


def test_unrelated_yaml_is_not_collected_and_globs_opt_in(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    conf = pytester.mkdir("conf")
    (conf / "ci.yaml").write_text("name: CI\non: push\njobs: {}\n")
    (conf / "docker-compose.yml").write_text("services: {web: {image: nginx}}\n")
    (conf / "list.yaml").write_text("- 1\n- 2\n")
    chaos = pytester.mkdir("chaos_scenarios")
    (chaos / "quick.yaml").write_text(scenario_yaml("quick", fault=False))

    named = pytester.runpytest_subprocess("conf", "test_plain.py", "--collect-only", "-q")
    assert "test_plain.py::test_ok" in named.outlines and not any(".yaml" in line for line in named.outlines)
    bare = pytester.runpytest_subprocess("--collect-only", "-q")  # nothing named: YAML is never run
    assert not any("quick" in line for line in bare.outlines), bare.outlines
    pytester.makeini("[pytest]\nchaos_scenario_glob = chaos_scenarios/*.yaml\n")
    globbed = pytester.runpytest_subprocess("--collect-only", "-q")
    assert "chaos_scenarios/quick.yaml::quick" in globbed.outlines, globbed.outlines
    assert not any("ci.yaml" in line or "compose" in line for line in globbed.outlines)


def test_bad_seed_in_the_environment_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLCHAOS_SEED", "twelve")
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*mlchaos: MLCHAOS_SEED='twelve' is not an integer seed*"])


# -- chaos_run ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_chaos_run_marker_overrides_and_seed_precedence(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makefile(".yaml", stall=scenario_yaml("stall"), quick=scenario_yaml("quick", fault=False, ticks=3))
    pytester.makeini("[pytest]\nchaos_seed = 1\nchaos_report_dir = out\n")
    monkeypatch.setenv("MLCHAOS_SEED", "2")
    pytester.makepyfile(
        test_runs="""
        import pytest
        from chaos.spec.scenario import load_scenario


        @pytest.mark.chaos(
            scenario="stall.yaml",
            seed=11,
            overrides={"checks": {"detected_within": {"params": {"within": "20s"}}}},
        )
        def test_marker_defaults_and_overrides(chaos_run):
            result = chaos_run(overrides={"faults": {"pause": {"duration": "700ms"}}})
            assert result.plan.seed == 11  # marker beats --chaos-seed, MLCHAOS_SEED and chaos_seed
            assert result.scenario.fault("pause").duration == pytest.approx(0.7)  # call overrides on top of the marker's
            [check] = [c for c in result.results if c.check == "detected_within"]
            assert check.bound == "<= 20s" and check.status == "pass"
            chaos_run.assert_passed(result)


        @pytest.mark.chaos(seed=11)
        def test_call_beats_marker_and_python_scenarios(chaos_run):
            scenario = load_scenario("quick.yaml")
            result = chaos_run(scenario, seed=5, overrides={"name": "renamed"})
            assert result.plan.seed == 5 and result.scenario.name == "renamed" and result.verdict == "pass"
            assert result.run_dir.parent.name == "out"  # chaos_report_dir from the ini file


        def test_option_beats_env_and_ini(chaos_run):
            result = chaos_run("quick.yaml")
            assert result.plan.seed == 9
            bad = chaos_run("quick.yaml", overrides={"target": {"command": ["false"]}})
            assert bad.verdict == "fail"
            with pytest.raises(AssertionError, match="completes  measured=1  bound=== 0"):
                chaos_run.assert_passed(bad)


        def test_bad_override_names_the_written_file(chaos_run):
            with pytest.raises(Exception, match=r"overridden.yaml:\\d+:\\d+: unknown key 'bogus'"):
                chaos_run("quick.yaml", overrides={"target": {"bogus": 1}})
        """
    )
    result = pytester.runpytest_subprocess("--chaos-seed", "9", "--junitxml=junit.xml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*mlchaos checks*", "test_runs.py::test_marker_defaults_and_overrides: stall: PASS*"])
    props = properties(junit_cases(pytester.path / "junit.xml")["test_option_beats_env_and_ini"])
    assert props["check:completes"] == "pass measured=0 bound=== 0"
    assert props["check:run2/completes"] == (
        "fail measured=1 bound=== 0 reason=the job itself failed with code 1, with no fault applied before it"
    )


# -- chaos_inject -------------------------------------------------------------------------------------------------


def test_chaos_inject_bitflip_and_grad_corrupt_restore_exact_bytes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_tensors="""
        import numpy as np
        import pytest
        import torch


        def words(t):
            return np.frombuffer(t.detach().numpy().tobytes(), dtype=np.int32).copy()


        def test_bitflip(chaos_inject):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 4))
            before = words(model[0].weight)
            with chaos_inject.bitflip(model, layer="0.weight", bit=30, count=1, seed=0) as armed:
                during = words(model[0].weight)
                [changed] = np.flatnonzero(during != before)
                assert during[changed] ^ before[changed] == 1 << 30  # exactly bit 30 of one element
                assert armed.target == "0.weight" and armed.records[0].record.indices == (changed,)
            assert (words(model[0].weight) == before).all()
            with pytest.raises(RuntimeError, match="boom"):
                with chaos_inject.bitflip(model, layer="0.weight", bit="exponent", count=3, seed=1):
                    assert not (words(model[0].weight) == before).all()
                    raise RuntimeError("boom")
            assert (words(model[0].weight) == before).all()  # restored when the block raised, too


        def test_grad_corrupt(chaos_inject):
            grad = torch.randn(64)
            before = words(grad)
            with chaos_inject.grad_corrupt(grad, kind="scale", element=8, block=4, factor=1e7) as record:
                assert record.indices == (8, 9, 10, 11)
                assert torch.allclose(grad[8:12], torch.from_numpy(before.view(np.float32)[8:12]) * 1e7)
            assert (words(grad) == before).all()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


@pytest.mark.slow
def test_chaos_inject_kill_freeze_slow_on_real_processes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("MLCHAOS_STATE_DIR", str(state))
    pytester.makepyfile(
        test_procs="""
        import subprocess, time
        from chaos.cluster.local import process_state


        def sleeper():
            return subprocess.Popen(["sleep", "60"])


        def test_freeze(chaos_inject):
            proc = sleeper()
            try:
                with chaos_inject.freeze(pid=proc.pid, duration=30) as applied:
                    # SIGSTOP is delivered asynchronously: a child that was still running reads 'R' for an instant.
                    deadline = time.monotonic() + 5
                    while process_state(proc.pid) != "T" and time.monotonic() < deadline:
                        time.sleep(0.01)
                    assert process_state(proc.pid) == "T"
                    assert applied.description.startswith(f"SIGSTOP pid {proc.pid}")
                assert process_state(proc.pid) == "S"
            finally:
                proc.kill()
                proc.wait()


        def test_kill(chaos_inject):
            proc = sleeper()
            with chaos_inject.kill(pid=proc.pid) as applied:
                assert proc.wait(timeout=10) == -9
            assert applied.state["signal"] == "SIGKILL"


        def test_slow(chaos_inject):
            proc = sleeper()
            try:
                with chaos_inject.slow(pid=proc.pid, stopped_fraction=0.5, period=0.2, duration=20) as applied:
                    seen = set()
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline and not {"S", "T"} <= seen:
                        seen.add(process_state(proc.pid))
                        time.sleep(0.01)
                    # stopped and sleeping in turn (R: the instant after a SIGCONT, seen on a busy machine)
                    assert {"S", "T"} <= seen <= {"S", "T", "R"}, seen
                    helper = applied.state["helper_pid"]
                time.sleep(0.3)
                assert process_state(proc.pid) == "S"  # continued, and the helper stopped cycling it
                assert process_state(helper) in (None, "Z")
            finally:
                proc.kill()
                proc.wait()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    kinds: dict[str, list[str]] = {}
    for journal in (state / "journal" / "done").glob("pytest-test_*.jsonl"):
        for line in journal.read_text().splitlines():
            record = json.loads(line)
            kinds.setdefault(record["op_id"], []).append(record["kind"])
    assert kinds.get("freeze-1") == ["intent", "deadman", "applied", "healed"]
    assert kinds.get("kill-1") == ["intent", "applied", "healed"]
    assert kinds.get("slow-1", [])[-1] == "healed"
    assert not list((state / "journal").glob("*.jsonl"))  # nothing left for cleanup


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None, reason="partition needs root and iptables")
def test_chaos_inject_partition_blocks_a_loopback_port_and_heals(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_net="""
        import socket, subprocess


        def connects(port):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    return True
            except OSError:
                return False


        def test_partition(chaos_inject):
            server = socket.socket()
            server.bind(("127.0.0.1", 0))
            server.listen(16)
            port = server.getsockname()[1]
            try:
                assert connects(port)
                with chaos_inject.partition(["127.0.0.1"], ports=[port], duration=60) as applied:
                    chains = [spec["chain"] for spec in applied.state["chains"]]
                    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
                    assert all(chain in rules for chain in chains)
                    assert not connects(port)
                assert connects(port)
                rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
                assert not any(chain in rules for chain in chains)
            finally:
                server.close()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1)


# -- chaos_testbed ------------------------------------------------------------------------------------------------


def _namespaces() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


@pytest.mark.slow
def test_chaos_testbed_builds_hosts_and_tears_them_down(pytester: pytest.Pytester) -> None:
    from chaos.testbed import namespaces as testbed

    reason = testbed.unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    # Namespace hosts share this machine's processes: the freeze goes over SSH to h1 and stops our ticker.
    pytester.makefile(".yaml", remote=scenario_yaml("remote", host="h1"))
    pytester.makeini("[pytest]\nchaos_testbed_hosts = 1\n")
    base = pytester.path / "inner-basetemp"
    ours = testbed.Layout.of(base / "chaos-testbed0").name_prefix  # the names of the session's own testbed
    pytester.makepyfile(
        test_tb=textwrap.dedent(
            f"""
            import subprocess

            def test_testbed(chaos_testbed, chaos_run):
                assert [host.name for host in chaos_testbed.hosts] == ["h1"]
                assert "{ours}h1" in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
                result = chaos_run("remote.yaml", inventory=chaos_testbed)
                chaos_run.assert_passed(result)
                [applied] = result.history.of("fault.applied")
                assert applied.data["host"] == "h1"
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--basetemp={base}")
    result.assert_outcomes(passed=1)
    # Torn down at session end: none of its namespaces is left (other workers' testbeds may stand beside it).
    assert not [name for name in _namespaces() if name.startswith(ours)]


# -- a signal during a run ----------------------------------------------------------------------------------------


def _frozen_tickers(under: Path) -> list[int]:
    """Pids of ticker targets (this module's TICKER) started for a run under ``under`` and now stopped."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "stall detected" in cmdline and str(under) in cmdline and process_state(int(entry.name)) == "T":
            found.append(int(entry.name))
    return found


def test_sigint_during_a_run_heals_it_and_stops_the_session(pytester: pytest.Pytester) -> None:
    """Ctrl-C while a scenario runs inside pytest: the run heals its fault and pytest stops (the next test never
    runs) instead of taking the signal as the run's alone and going on."""
    long = scenario_yaml("long", ticks=600).replace("duration: 1s", "duration: 60s").replace("30s", "60s")
    pytester.makefile(".yaml", long=long)
    pytester.makepyfile(
        test_runs="""
        from pathlib import Path

        def test_long(chaos_run):
            chaos_run("long.yaml")

        def test_after():
            Path("after-ran").write_text("it ran")
        """
    )
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_runs.py"],
        cwd=pytester.path,
        env={**os.environ, "MLCHAOS_STATE_DIR": str(pytester.path / "state")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    frozen: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not frozen and time.monotonic() < deadline and session.poll() is None:
            time.sleep(0.1)
            frozen = _frozen_tickers(pytester.path)
        assert frozen, "the freeze never landed on the ticker"
        session.send_signal(signal.SIGINT)
        output, _ = session.communicate(timeout=90)
    finally:
        if session.poll() is None:
            session.kill()
            session.wait(timeout=10)
    assert session.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "mlchaos: run 'long' interrupted" in output and "KeyboardInterrupt" in output, output
    assert not (pytester.path / "after-ran").exists(), "pytest went on to the next test"
    assert all(process_state(pid) != "T" for pid in frozen), "the freeze outlived the interrupted session"
    [run_json] = pytester.path.glob("**/long-*/run.json")
    document = json.loads(run_json.read_text())
    assert document["ended_by"] == "interrupted" and document["verdict"] == "error"
    kinds = [e["kind"] for e in document["events"]]
    assert kinds.index("fault.applied") < kinds.index("fault.healed")
