"""Benchmarks: what our safety machinery costs, as ratios measured within one run.

Run: ``make bench`` (or ``.venv/bin/python benchmarks/run.py [--json]``; ``--json``: every figure as one JSON
object on the last line). Results go to stdout and are recorded by hand
in BENCHMARKS.md together with the machine they came from. Absolute numbers drift between machines; the
ratios are what we track.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.cluster.local import LocalTransport, process_state  # noqa: E402
from chaos.history.timeline import History  # noqa: E402
from chaos.plugins.injector import FaultOp, InjectionContext  # noqa: E402
from chaos.run.orchestrator import RunOptions, execute  # noqa: E402
from chaos.safety import deadman  # noqa: E402
from chaos.safety.journal import Journal  # noqa: E402
from chaos.spec.scenario import load_scenario  # noqa: E402
from injectors.process.faults import FreezeInjector, FreezeParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bitflip_vs_pytorchfi  # noqa: E402
import checksum_allreduce  # noqa: E402
import load_generator  # noqa: E402
import partition_hosts  # noqa: E402
import serving_stack  # noqa: E402
import stream_load  # noqa: E402

# The benchmark modules run after the harness's own figures: a section heading and the module, whose main()
# returns its figures (stored under the module's name).
SECTIONS: tuple[tuple[str, ModuleType], ...] = (
    ("SDC: checksummed vs plain all-reduce", checksum_allreduce),
    ("SDC: in-place bit flips vs pytorchfi", bitflip_vs_pytorchfi),
    ("multi-host: partition apply+heal on 1..64 testbed hosts", partition_hosts),
    ("serving: open-loop load generator", load_generator),
    ("serving: the reference stack under load, and a failover", serving_stack),
    ("serving: streamed load, tokens and the generator's ceiling", stream_load),
)


def _per_op(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n


def bench_history_and_journal(tmp: Path) -> dict[str, float]:
    memory, on_disk = History(), History(tmp / "h.jsonl")
    n = 20_000
    t_mem = _per_op(lambda i: memory.record("target.step", rank=0, step=i, loss=0.5), n)
    t_disk = _per_op(lambda i: on_disk.record("target.step", rank=0, step=i, loss=0.5), n)
    journal = Journal(tmp / "j.jsonl")
    from chaos.plugins.injector import Applied

    applied = Applied(op_id="x", fault="f", injector="freeze", state={"pids": [1]})
    t_journal = _per_op(lambda i: journal.intent(applied.model_copy(update={"op_id": f"x{i}"})), 500)
    journal.close()
    print(f"history.record in memory        {t_mem * 1e6:8.1f} us/event")
    print(f"history.record + JSONL line     {t_disk * 1e6:8.1f} us/event   ratio to memory {t_disk / t_mem:5.2f}x")
    print(
        f"journal record (fsync)          {t_journal * 1e6:8.1f} us/record  ratio to JSONL  {t_journal / t_disk:5.1f}x"
    )
    return {"history_memory_us": t_mem * 1e6, "history_jsonl_us": t_disk * 1e6, "journal_fsync_us": t_journal * 1e6}


def bench_freeze_roundtrip(tmp: Path) -> dict[str, float]:
    """A journaled, dead-man-covered freeze+heal against a bare SIGSTOP/SIGCONT of the same process."""
    victim = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        bare, full = [], []
        for _ in range(10):
            start = time.perf_counter()
            os.kill(victim.pid, signal.SIGSTOP)
            while process_state(victim.pid) != "T":
                pass
            os.kill(victim.pid, signal.SIGCONT)
            while process_state(victim.pid) == "T":
                pass
            bare.append(time.perf_counter() - start)
        injector, ctx = FreezeInjector(), InjectionContext(LocalTransport())
        journal = Journal(tmp / "freeze.jsonl")
        for k in range(10):
            start = time.perf_counter()
            op = FaultOp(
                op_id=f"f#{k}", fault="f", injector="freeze", params=FreezeParams(pid=victim.pid), duration_s=30
            )
            applied = injector.prepare(ctx, op)
            journal.intent(applied)
            dm = deadman.arm(journal.path, op.op_id, injector.revert_command(applied) or [], 60)
            injector.apply(ctx, applied)
            journal.applied(op.op_id, applied.state)
            injector.heal(ctx, applied)
            deadman.disarm(dm, op.op_id)
            journal.healed(op.op_id, "harness")
            full.append(time.perf_counter() - start)
        journal.close()
        b, f = statistics.median(bare), statistics.median(full)
        print(f"bare SIGSTOP+SIGCONT            {b * 1e3:8.2f} ms")
        print(f"freeze+heal, journaled+dead-man {f * 1e3:8.2f} ms   ratio {f / b:6.1f}x (median of 10)")
        return {"bare_stop_cont_ms": b * 1e3, "freeze_heal_ms": f * 1e3, "freeze_heal_ratio": f / b}
    finally:
        victim.send_signal(signal.SIGCONT)
        victim.kill()
        victim.wait()


def bench_kill_rank(tmp: Path) -> dict[str, Any]:
    """The kill-rank scenario against its golden run: what one SIGKILL costs the job end to end."""
    scenario = load_scenario(ROOT / "scenarios" / "kill-rank.yaml")
    start = time.perf_counter()
    golden = execute(scenario.without_faults(), RunOptions(report_root=tmp / "g", golden=False))
    t_golden = time.perf_counter() - start
    start = time.perf_counter()
    faulted = execute(scenario, RunOptions(report_root=tmp / "f", golden_cache=False))
    t_faulted = time.perf_counter() - start  # includes its own (uncached) golden run
    measured = {r.check: r.measured for r in faulted.results}
    applied = faulted.history.of("fault.applied")[0]
    trigger = next(e for e in faulted.history.of("target.step") if e.rank == 1 and (e.get_int("step") or 0) >= 25)
    print(f"  trigger (step 25 event) -> fault applied  {(applied.ts_ns - trigger.ts_ns) / 1e6:.1f} ms")
    print(f"kill-rank verdict               {faulted.verdict} (golden run alone {golden.verdict})")
    print(f"  detection latency             {measured.get('detected_within')} s")
    print(f"  recovery (past fault step)    {measured.get('recovered_within')} s")
    print(f"  steps recomputed              {measured.get('lost_work_at_most')}")
    print(f"  faulted run + golden / golden {t_faulted / t_golden:5.2f}x  (golden alone {t_golden:.1f}s)")
    return {
        "trigger_to_fault_ms": (applied.ts_ns - trigger.ts_ns) / 1e6,
        "verdict": str(faulted.verdict),
        "detected_within_s": measured.get("detected_within"),
        "recovered_within_s": measured.get("recovered_within"),
        "lost_steps": measured.get("lost_work_at_most"),
        "faulted_over_golden": t_faulted / t_golden,
    }


def main(as_json: bool = False) -> dict[str, Any]:
    """Run every benchmark; with ``as_json`` print all their figures as one JSON object on the last line."""
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mlchaos-bench-") as tmp:
        os.environ.setdefault("MLCHAOS_STATE_DIR", str(Path(tmp) / "state"))
        print(f"mlchaos benchmarks, python {sys.version.split()[0]}, {os.cpu_count()} cpus")
        print("\n== harness: history, journal, freeze round trip, kill-rank end to end")
        figures["history_and_journal"] = bench_history_and_journal(Path(tmp))
        figures["freeze_roundtrip"] = bench_freeze_roundtrip(Path(tmp))
        figures["kill_rank"] = bench_kill_rank(Path(tmp))
    for heading, module in SECTIONS:
        name = module.__name__
        print(f"\n== {heading} (benchmarks/{name}.py)")
        figures[name] = module.main()
    if as_json:
        print(json.dumps(figures, sort_keys=True, default=str))
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print every figure as one JSON object on the last line")
    main(parser.parse_args().json)
