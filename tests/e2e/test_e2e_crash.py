"""The ``crash`` fault on a script as users write it plus the one ``attach`` line (``tests/jobs/user_plain_ddp.py``:
DDP, Adam, its own checkpoint every 4 steps and resume), under torchrun through the whole harness, once per kind:

- ``exception`` at step 6, phase backward: rank 1 ends with the InjectedFault traceback and exit code 1;
- ``segfault`` at step 6, inside the gradient all-reduce: rank 1 dies of SIGSEGV (-11);
- ``abort`` at step 6, phase optimizer_step: rank 1 dies of SIGABRT (-6).

Each run: exactly one ``fault.applied`` of the op (rank 1, step 6, its phase and kind, from the job), torchrun's
report of rank 1's exit with the expected code, and the checks pass: detected (rank 1's exit, or rank 0's broken
connection to it), recovered, at most the 4 steps since the last checkpoint lost, the job completes. torchrun logs
only the first failed local rank it finds in a poll: when rank 0 died of the broken connection before that poll
(its gloo error can abort it, -6), torchrun names rank 0, and rank 1's own code is not in its log.

The shipped ``scenarios/crash-rank-*.yaml`` (the reference trainer) pass ``mlchaos validate`` in ``make test``;
their runs are measured in docs/scenarios.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT, attached_script, run_user_script, verdicts

pytestmark = pytest.mark.slow

JOB = ROOT / "tests" / "jobs" / "user_plain_ddp.py"
ARGS: list[str | float] = ["--steps", 12, "--checkpoint-dir", "{run_dir}/ckpt", "--checkpoint-every", 4]
ARGS += ["--step-time", 0.02, "--pg-timeout", 10]
TRACEBACK = "[rank1]: chaos.injob.crash_faults.InjectedFault: crash fault 'crash' (op crash#1) on rank 1 at step 6"


@pytest.mark.parametrize(
    ("kind", "phase", "exitcode"),
    [("exception", "backward", 1), ("segfault", "allreduce", -11), ("abort", "optimizer_step", -6)],
)
def test_a_crash_fires_once_kills_its_rank_as_its_kind_says_and_the_job_recovers(
    e2e_report_root: Path, tmp_path: Path, kind: str, phase: str, exitcode: int
) -> None:
    job = attached_script(JOB, tmp_path / "attached.py", "chaos.agent.attach(model, optimizer, ddp=ddp)")
    crash = {
        "name": "crash",
        "type": "crash",
        "params": {"rank": 1, "kind": kind, "phase": phase},
        "trigger": {"at_step": 6, "rank": 1},
    }
    checks = [
        {"type": "detected_within", "params": {"fault": "crash", "within": "10s"}},
        {"type": "recovered_within", "params": {"fault": "crash", "within": "60s"}},
        {"type": "lost_work_at_most", "params": {"steps": 4}},
        {"type": "completes"},
    ]
    result = run_user_script(e2e_report_root, tmp_path, f"crash-{kind}", job, ARGS, crash, checks)
    got = verdicts(result)
    assert all(status == "pass" for status, _ in got.values()), got
    [applied] = [e for e in result.history.of("fault.applied") if e.get_str("op") == "crash#1"]
    assert (applied.source, applied.rank, applied.get_int("step")) == ("target", 1, 6), applied.data
    assert (applied.get_str("phase"), applied.get_str("crash_kind")) == (phase, kind), applied.data
    exits = [e for e in result.history.of("detect.worker_exit") if e.get_int("exitcode") != 0]
    named = [(e.rank, e.get_int("exitcode")) for e in exits]
    assert (1, exitcode) in named or (bool(named) and named[0][0] == 0), [e.data for e in exits]
    assert (TRACEBACK in (result.run_dir / "target.log").read_text()) == (kind == "exception")
