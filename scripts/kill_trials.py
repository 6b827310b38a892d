"""Kill the harness mid-fault, many times: after each kill, at the run's deadline + heal_grace, nothing is left.

Run: ``.venv/bin/python scripts/kill_trials.py [--trials-per-kind 5] [--seed 1] [--kinds freeze,partition]
[--parallel 4] [--remote-trials N] [--docker-trials N] [--json]`` (as root: cgroups, iptables, FUSE). Each trial
is a real ``mlchaos run`` (its own state dir, so its journal is its own) of a command target (odd trials) or a
two-replica roles target (even ones) beside a victim process, with ONE fault of a kind that runs on this machine,
with or without a duration (duration-less faults are the ones only the run's deadline ends). ``--remote-trials``
and ``--docker-trials`` add trials of :data:`REMOTE_KINDS` on host h2 of a testbed brought up for them (network
namespaces over SSH, or containers): the job on a testbed host, the fault's dead-man h2's own switch.
The harness is SIGKILLed at a seeded random moment while the fault is applied, then, at its run's deadline
(its fault clock's start + ``max_duration``) + ``heal_grace`` + a little slack, the trial looks for leftovers:

- the victim is running (not stopped by a freeze or a duty cycle);
- no process is left whose command line carries the trial's tag (helpers, holds, dead-men, the target, the load);
- every iptables chain, cgroup, helper pid and clock offset file the journal recorded for the op is gone; no mount under the trial;
- the journal says the op was healed, and by whom (``deadman`` expected: the harness was dead).

Prints one line per trial and a summary per kind; exit 1 when any trial left something. ``--json`` prints one
JSON object as the last line. Nothing here is faked: the faults, the kill and the heals are the real ones.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.cluster.local import process_state  # noqa: E402
from chaos.cluster.poll import wait_until  # noqa: E402
from chaos.plugins import registry  # noqa: E402
from chaos.plugins.injector import needs_duration  # noqa: E402

CLI = [str(ROOT / ".venv" / "bin" / "mlchaos")] if (ROOT / ".venv" / "bin" / "mlchaos").exists() else ["mlchaos"]
MAX_DURATION_S, GRACE_S, FAULT_S, APPLY_AT_S = 10.0, 2.0, 6.0, 1.0
PEER = "127.0.0.77"  # a loopback address nothing uses: the network faults' rules match it and nothing else


def _fault(kind: str, tag: str, victim: int, folder: Path) -> dict[str, Any]:
    """One fault of ``kind`` on the victim (or, for network faults, towards :data:`PEER`)."""
    params: dict[str, Any] = {
        "freeze": {"pid": victim},
        "slow": {"pid": victim, "stopped_fraction": 0.5, "period": 1.0},
        "cpu_throttle": {"pid": victim, "fraction": 0.2},
        "memory_pressure": {"megabytes": 32},
        "partition": {"peers": [PEER]},
        "packet_loss": {"peers": [PEER], "probability": 0.5},
        "duplicate": {"peers": [PEER], "probability": 0.5},
        "flap": {"peers": [PEER], "period": 1.0},
        "storage": {"path": str(folder / "data"), "mode": "latency", "latency": 0.2},
        "drop_large_packets": {"peers": [PEER], "min_size": 1024},
        "bandwidth": {"peers": [PEER], "rate": "1mbit"},
        "delay": {"peers": [PEER], "delay": "50ms"},
        "jitter": {"peers": [PEER], "jitter": "10ms", "delay": "50ms"},
        "gpu_xid": {"code": 79, "log": str(folder / "xid.log")},
        "freeze_under_load": {"pid": victim},
        "clock": {"jump": "+1h"},  # every process of the target: the shim's offset file in the run's folder
    }[kind]
    if kind == "freeze_under_load":
        return {"name": f"f-{tag}", "type": "freeze", "params": params, "trigger": {"after": f"{APPLY_AT_S:g}s"}}
    return {"name": f"f-{tag}", "type": kind, "params": params, "trigger": {"after": f"{APPLY_AT_S:g}s"}}


KINDS = (
    "freeze",
    "slow",
    "cpu_throttle",
    "memory_pressure",
    "partition",
    "packet_loss",
    "flap",
    "storage",
    "duplicate",
    "drop_large_packets",
    "bandwidth",
    "delay",
    "jitter",
    "gpu_xid",
    "freeze_under_load",
    "clock",
)
# The kinds whose fault may be held without a duration (until its heal): every other trial of these omits it.
DURATIONLESS = tuple(kind for kind, cls in registry.injectors().items() if kind in KINDS and not needs_duration(cls))
# freeze_under_load: the victim is an HTTP server (an http target) under the open-loop load generator, frozen;
# the load generator must die with the harness.
REMOTE_KINDS = ("partition", "packet_loss", "freeze", "slow")
# Faults on a whole container (its dead-man runs here, on the harness's machine: it reaches the Docker API): on
# host h3, one at a time (a stopped container takes anything else on it down).
CONTAINER_KINDS = ("container_pause", "container_stop", "container_cpu")
# Faults on a Slurm node of the Slurm testbed (their dead-man runs here too: the testbed's commands): on h2, one
# at a time (one node).
SLURM_KINDS = ("drain", "slurmd_stop", "node_fail")
SERIAL_KINDS = ("bandwidth", "delay", "jitter")  # one root qdisc per interface (netem too): one at a time


@dataclass
class Trial:
    kind: str
    index: int
    durationless: bool
    kill_after_s: float
    left: list[str] = field(default_factory=list)
    healed_by: str | None = None
    seconds: float = 0.0

    def line(self) -> str:
        what = "no duration" if self.durationless else f"duration {FAULT_S:g}s"
        verdict = "clean" if not self.left else "LEFT: " + "; ".join(self.left)
        return (
            f"{self.kind:16} #{self.index} ({what}, killed {self.kill_after_s:.2f}s after apply): {verdict} "
            f"(healed by {self.healed_by}, {self.seconds:.0f}s)"
        )


def _cmdlines() -> dict[int, str]:
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found[int(entry)] = (
                    Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:
                pass
    return found


def _trial_scenario(
    name: str, seed: int, target: dict[str, Any], fault: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """A trial's scenario: its target, its one fault, a progress check, the trials' limits (no stall cut-off)."""
    safety = {"max_duration": f"{MAX_DURATION_S:g}s", "heal_grace": f"{GRACE_S:g}s", "no_progress_timeout": None}
    checks = [{"type": "progress"}]
    return {
        "name": name,
        "seed": seed,
        "target": target,
        "faults": [fault],
        "checks": checks,
        **extra,
        "safety": safety,
    }


def _spawn_run(scenario: dict[str, Any], folder: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], float]:
    """``mlchaos run`` of ``scenario`` (written to the trial's folder) in the background; the harness and when it
    started (monotonic)."""
    source = folder / "trial.yaml"
    source.write_text(json.dumps(scenario))
    harness = subprocess.Popen(
        [*CLI, "run", str(source), "--report-dir", str(folder / "reports"), "--no-golden"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return harness, time.monotonic()


def _into_the_fault(trial: Trial, folder: Path) -> float | None:
    """Wait for the run to apply its fault (its journal says so), then the trial's seeded moment; when it was
    applied (monotonic), or None (noted on the trial) when it never was."""
    if not wait_until(lambda: any(r.get("kind") == "applied" for r in _journal(folder / "state")), 30):
        trial.left.append("the fault was never applied (no journal record)")
        return None
    applied_at = time.monotonic()
    time.sleep(trial.kill_after_s)
    return applied_at


def _sleep_past_the_deadline(applied_at: float, started: float) -> None:
    """Until the killed run's deadline + heal_grace + a little slack (the reverter's own work). The run's
    deadline counts from its fault clock, which started before the apply (trigger: after APPLY_AT_S)."""
    clock_start = min(applied_at - APPLY_AT_S, started + 30)
    time.sleep(max(0.0, clock_start + MAX_DURATION_S + GRACE_S + 3.0 - time.monotonic()))


def _journal(state_dir: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(state_dir.glob("journal/**/*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return records


def _strings_and_pids(value: Any, key: str = "") -> tuple[list[str], list[int]]:
    strings: list[str] = []
    pids: list[int] = []
    if isinstance(value, dict):
        for k, v in value.items():
            s, p = _strings_and_pids(v, k)
            strings += s
            pids += p
    elif isinstance(value, list):
        for v in value:
            s, p = _strings_and_pids(v, key)
            strings += s
            pids += p
    elif isinstance(value, str):
        strings.append(value)
    elif isinstance(value, int) and not isinstance(value, bool) and key.endswith("pid"):
        pids.append(value)
    return strings, pids


def run_trial(kind: str, index: int, rng: random.Random, keep: bool = False) -> Trial:
    # Odd trials of a kind that may go without a duration (partition, packet_loss) have none: only the run's
    # deadline ends those.
    trial = Trial(
        kind, index, durationless=index % 2 == 1 and kind in DURATIONLESS, kill_after_s=rng.uniform(0.3, FAULT_S - 1.0)
    )
    began = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix=f"mlchaos-trial-{kind}-"))
    tag = f"{rng.getrandbits(40):010x}"
    (folder / "data").mkdir()
    port = 0
    if kind == "freeze_under_load":
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        serve = f"import http.server as h; h.ThreadingHTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
        victim = subprocess.Popen(
            [sys.executable, "-c", serve, f"victim-{tag}"],
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    else:
        victim = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)", f"victim-{tag}"])
    env = {**os.environ, "MLCHAOS_STATE_DIR": str(folder / "state")}
    harness: subprocess.Popen[bytes] | None = None
    try:
        fault = _fault(kind, tag, victim.pid, folder)
        if not trial.durationless:
            fault["duration"] = f"{FAULT_S:g}s"
        job = [sys.executable, "-c", "import time; time.sleep(600)", f"target-{tag}"]
        target: dict[str, Any] = {"type": "command", "command": job}
        if index % 2 == 0:  # even trials: a roles target of two replicas, whose processes must die with it too
            target = {"type": "roles", "roles": {"job": {"command": job, "replicas": 2}}, "until": ["job"]}
        scenario = _trial_scenario(f"trial-{kind}", index, target, fault)
        if kind == "freeze_under_load":
            url = f"http://127.0.0.1:{port}/"
            scenario["target"] = {"type": "http", "url": url}
            scenario["load"] = {"url": url, "rate": 20, "duration": f"{MAX_DURATION_S:g}s", "timeout": 1.0}
        harness, started = _spawn_run(scenario, folder, env)
        applied_at = _into_the_fault(trial, folder)
        if applied_at is None:
            return trial

        def loaders() -> list[int]:  # the load generator: its spec (with this trial's port) is in its argv
            return [pid for pid, cmd in _cmdlines().items() if "chaos.load" in cmd and f"127.0.0.1:{port}/" in cmd]

        if port and not loaders():
            trial.left.append("no load generator was running when the harness was killed: the trial proves nothing")
        jobs = [pid for pid, cmd in _cmdlines().items() if f"target-{tag}" in cmd]
        if not port and len(jobs) < (2 if target["type"] == "roles" else 1):
            trial.left.append(f"the target's processes were not all running when the harness was killed: {jobs}")
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        if port and not wait_until(lambda: not loaders(), 10):
            trial.left.append(f"the load generator outlived the harness: {loaders()}")
        _sleep_past_the_deadline(applied_at, started)
        records = _journal(folder / "state")
        healed = [r for r in records if r.get("kind") == "healed"]
        trial.healed_by = healed[-1].get("by") if healed else None
        if not healed:
            trial.left.append("the journal has no heal for the op")
        if process_state(victim.pid) in ("T", "t"):
            trial.left.append("the victim is still stopped")
        others = [
            f"{pid}: {cmd[:80]}"
            for pid, cmd in _cmdlines().items()
            if (tag in cmd or str(folder) in cmd) and pid != victim.pid
        ]  # the load generator: its run dir
        if others:
            trial.left.append(f"processes left: {others}")
        rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=False).stdout
        for record in records:
            recorded = {
                "state": record.get("state"),
                "applied": (record.get("applied") or {}).get("state"),
                "deadman_pid": record.get("pid"),
            }
            strings, pids = _strings_and_pids(recorded)
            for text in strings:
                if re.fullmatch(r"CHAOS-[0-9a-f]{10}-(in|out)", text) and text in rules:
                    trial.left.append(f"iptables chain {text}")
                if text.startswith("/sys/fs/cgroup/") and "chaos-" in text and os.path.isdir(text):
                    trial.left.append(f"cgroup {text}")
                if text.startswith(str(folder)) and "/clock/" in text and os.path.exists(text):
                    trial.left.append(f"clock offset file {text} (still in force)")
            for pid in pids:
                if pid != victim.pid and process_state(pid) not in (None, "Z"):
                    trial.left.append(f"pid {pid} ({_cmdlines().get(pid, '?')[:60]})")
        xid = folder / "xid.log"
        if xid.exists() and "Xid" in xid.read_text():
            trial.left.append("the XID line is still in the kernel log it was written to")
        qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, check=False).stdout
        for record in records:
            shaped = (record.get("applied") or {}).get("state") or {}
            handle, interface = shaped.get("handle"), shaped.get("interface")
            if isinstance(handle, str) and any(
                handle.rstrip(":") + ":" in line.split() and f"dev {interface} " in line and " root " in line
                for line in qdiscs.splitlines()
            ):
                trial.left.append(f"qdisc {handle} on {interface}")
        bound = Path("/proc/net/netfilter/nfnetlink_queue")
        queues = {line.split()[0] for line in bound.read_text().splitlines()} if bound.exists() else set()
        for record in records:
            queue = ((record.get("applied") or {}).get("state") or {}).get("queue")
            if queue is not None and str(queue) in queues:
                trial.left.append(f"NFQUEUE queue {queue} still bound (a packet holder)")
        mounts = Path("/proc/mounts").read_text()
        if str(folder) in mounts:
            trial.left.append("a mount under the trial's folder")
        return trial
    finally:
        if harness is not None and harness.poll() is None:
            harness.kill()
        victim.send_signal(signal.SIGCONT)
        victim.kill()
        victim.wait(timeout=10)
        trial.seconds = time.monotonic() - began
        if trial.left:  # heal what was left, so one failed trial does not poison the machine or the next trial
            subprocess.run([*CLI, "cleanup"], env=env, cwd=ROOT, capture_output=True, timeout=120, check=False)
        if not keep and not trial.left:
            shutil.rmtree(folder, ignore_errors=True)


def _host_transport(inventory: Path, host: str) -> Any:
    """The transport to inventory host ``host`` (Docker for a container, SSH otherwise), as a run opens it."""
    from chaos.cluster.hosts import open_transport
    from chaos.cluster.inventory import load_inventory

    return open_transport(load_inventory(inventory), host)


def _container_facts(inventory: Path, host: str) -> dict[str, Any]:
    """What a container fault changes, read through the Docker API: running or not, paused or not, its CPU
    limits (a CpuQuota of 0 and of -1 both mean none: ``docker update`` reads 0 as "unchanged", so a restore of
    "no quota" writes -1)."""
    import docker

    from chaos.cluster.inventory import load_inventory

    name = load_inventory(inventory).host(host).container or ""
    attrs = docker.from_env().containers.get(name).attrs
    limits = attrs["HostConfig"]
    return {
        "status": attrs["State"]["Status"],
        "paused": attrs["State"]["Paused"],
        "cpus": (limits.get("NanoCpus"), max(0, limits.get("CpuQuota") or 0), limits.get("CpuPeriod")),
    }


def _node_facts(inventory: Path, host: str) -> dict[str, Any]:
    """What a Slurm node fault changes, as the testbed's controller and the host say: the node's state flags
    (sinfo %T: idle, drained, down...) and whether its slurmd runs."""
    conf = next(inventory.parent.glob("*slurm/slurm.conf"))
    state = subprocess.run(
        ["sinfo", "-h", "-N", "-n", host, "-o", "%T"],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.strip()
    from chaos.cluster.inventory import load_inventory

    netns = load_inventory(inventory).host(host).labels.get("netns")
    daemons = [pid for pid, cmd in _cmdlines().items() if cmd.split(" ", 1)[0].endswith("/slurmd")]
    slurmd = any(
        subprocess.run(
            ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=False
        ).stdout.strip()
        == netns
        for pid in daemons
    )
    return {"state": state, "slurmd": slurmd}


def _start_remote_victim(transport: Any, tag: str) -> int:
    """A shell loop on the transport's host, detached from everything (it must outlive the harness: a freeze or
    a duty cycle on it is what the dead-man heals), named ``victim-<tag>``; its pid as this machine sees it (a
    testbed host's processes, in a container too, are visible in this machine's /proc)."""
    transport.run(
        [
            "sh",
            "-c",
            'setsid -f sh -c "while :; do sleep 0.2; done" "$1" </dev/null >/dev/null 2>&1',
            "sh",
            f"victim-{tag}",
        ],
        timeout=30,
        check=True,
    )
    found: list[int] = []
    wait_until(lambda: bool(found.extend(p for p, c in _cmdlines().items() if f"victim-{tag}" in c) or found), 10)
    if not found:
        raise RuntimeError(f"the victim did not start on {transport.host}")
    return min(found)


def run_remote_trial(kind: str, index: int, rng: random.Random, inventory: Path, host: str = "h2") -> Trial:
    """A trial whose job and fault are on testbed host ``host`` (a namespace host over SSH or a container;
    the fault's dead-man is the host's own switch): the harness is killed, the job there dies with it, the
    host's switch heals by the run's deadline + grace (a freeze or a duty cycle of a victim on that host: it
    runs again; a partition: its chains are gone; a duty cycle's helper there: gone), then ``mlchaos cleanup``
    asks the host and journals that heal as the dead-man's (never healing it again)."""
    from chaos.safety import remote_deadman

    h = _host_transport(inventory, host)
    where = f"{host}({'docker' if type(h).__name__ == 'DockerTransport' else 'ssh'})"
    trial = Trial(
        f"{kind}@{where}",
        index,
        durationless=index % 2 == 1 and kind in DURATIONLESS,
        kill_after_s=rng.uniform(0.3, FAULT_S - 1.0),
    )
    began = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix=f"mlchaos-trial-{kind}-{host}-"))
    tag = f"{rng.getrandbits(40):010x}"
    env = {**os.environ, "MLCHAOS_STATE_DIR": str(folder / "state")}
    harness: subprocess.Popen[bytes] | None = None
    victim: int | None = None
    try:
        params: dict[str, Any] = {
            "partition": {"peers": ["host:h1"]},
            "packet_loss": {"peers": ["host:h1"], "probability": 0.5},
            "freeze": {"name": f"victim-{tag}"},
            "slow": {"name": f"victim-{tag}", "stopped_fraction": 0.5, "period": 1.0},
            "container_pause": {},
            "container_stop": {"timeout": 1.0},
            "container_cpu": {"cpus": 0.25},
            "drain": {"reason": f"trial {tag}"},
            "slurmd_stop": {},
            "node_fail": {},
        }[kind]
        container = _container_facts(inventory, host) if kind in CONTAINER_KINDS else None
        node = _node_facts(inventory, host) if kind in SLURM_KINDS else None
        if kind in ("freeze", "slow"):
            victim = _start_remote_victim(h, tag)
        fault: dict[str, Any] = {
            "name": f"f-{tag}",
            "type": kind,
            "params": params,
            "hosts": {"host": host},
            "trigger": {"after": f"{APPLY_AT_S:g}s"},
        }
        if not trial.durationless:
            fault["duration"] = f"{FAULT_S:g}s"
        # The job runs on a testbed host too (a roles target): it must die with the harness there (the channel's
        # watcher). On h1 when the fault hits a victim by name on h2: a name is searched below the target's own
        # processes on a host the target runs on.
        job_host = host if victim is None and container is None and node is None else "h1"
        job = {"command": ["{python}", "-c", "import time; time.sleep(600)", f"target-{tag}"], "host": job_host}
        target: dict[str, Any] = {"type": "roles", "roles": {"job": job}, "until": ["job"]}
        if node is not None:  # node faults act on the cluster of a slurm target: a batch job on h1
            (folder / "job.sbatch").write_text("#!/bin/sh\nsleep 600\n")
            target = {
                "type": "slurm",
                "script": str(folder / "job.sbatch"),
                "args": [f"target-{tag}"],
                "nodes": 1,
                "partition": "chaos",
                "sbatch": ["--nodelist=h1"],
                "job_name": f"trial-{tag}",
            }
        scenario = _trial_scenario(f"trial-{kind}-{host}", index, target, fault, cluster={"inventory": str(inventory)})
        harness, started = _spawn_run(scenario, folder, env)
        applied_at = _into_the_fault(trial, folder)
        if applied_at is None:
            return trial
        if victim is not None and kind == "freeze" and process_state(victim) not in ("T", "t"):
            trial.left.append("the victim was not stopped while its freeze was applied: the trial proves nothing")
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        _sleep_past_the_deadline(applied_at, started)
        if victim is not None and process_state(victim) in ("T", "t"):
            trial.left.append(f"the victim on {host} is still stopped")
        if container is not None and (now := _container_facts(inventory, host)) != container:
            trial.left.append(f"container {host} is {now}, it was {container}")
        if node is not None and not wait_until(lambda: _node_facts(inventory, host) == node, 30):
            trial.left.append(f"Slurm node {host} is {_node_facts(inventory, host)}, it was {node}")
        rules = h.run(["iptables", "-S"], check=True).stdout
        ops = set()
        for record in _journal(folder / "state"):
            ops.add(str(record.get("op_id")))
            strings, _ = _strings_and_pids((record.get("applied") or {}).get("state"))
            trial.left += [
                f"chain {t} on {host}"
                for t in strings
                if re.fullmatch(r"CHAOS-[0-9a-f]{10}-(in|out)", t) and t in rules
            ]
            if record.get("kind") == "intent":
                switches = [c for c in _cmdlines().values() if remote_deadman.marker(str(record.get("op_id"))) in c]
                trial.left += [f"{host}'s switch still running: {c[:60]}" for c in switches]
        helpers = [c for c in _cmdlines().values() if any(f"--op-id {op}" in c for op in ops if op != "None")]
        trial.left += [f"a helper of the op still running: {c[:80]}" for c in helpers]
        cleanup = subprocess.run(
            [*CLI, "cleanup", "--inventory", str(inventory)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        # A container's or a node's fault is healed by the dead-man here, which journals it itself: nothing for cleanup.
        if container is not None or node is not None:
            if "nothing to heal" not in cleanup.stdout:
                trial.left.append(f"cleanup found something to heal: {cleanup.stdout.strip()[-200:]}")
        elif f"already healed by its dead-man on {host}" not in cleanup.stdout:
            trial.left.append(f"cleanup did not find {host}'s heal: {cleanup.stdout.strip()[-200:]}")
        healed = [r for r in _journal(folder / "state") if r.get("kind") == "healed"]
        trial.healed_by = healed[-1].get("by") if healed else None
        if node is not None:
            # Slurm ends a dead harness's job at its time limit: whole minutes from its start (here 1), enforced
            # by slurmctld's periodic check (every 30 s) and then KillWait (5 s on the testbed).
            time.sleep(max(0.0, started + 60 + 30 + 5 + 10 - time.monotonic()))
            conf = next(inventory.parent.glob("*slurm/slurm.conf"))
            queued = subprocess.run(
                ["squeue", "-h", "-n", f"trial-{tag}", "-o", "%i %T"],
                capture_output=True,
                text=True,
                env={**os.environ, "SLURM_CONF": str(conf)},
                timeout=30,
                check=False,
            ).stdout.strip()
            if queued:
                trial.left.append(f"the Slurm job is still queued: {queued}")
        others = [f"{pid}: {cmd[:80]}" for pid, cmd in _cmdlines().items() if tag in cmd and pid != victim]
        if others:
            trial.left.append(f"processes left: {others}")
        return trial
    finally:
        if harness is not None and harness.poll() is None:
            harness.kill()
        if victim is not None:
            for pid in [p for p, c in _cmdlines().items() if f"victim-{tag}" in c]:
                try:
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        h.close()
        trial.seconds = time.monotonic() - began
        if trial.left:
            subprocess.run(
                [*CLI, "cleanup", "--inventory", str(inventory)],
                env=env,
                cwd=ROOT,
                capture_output=True,
                timeout=120,
                check=False,
            )
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _testbed_trials(testbed: str, count: int, seed: int) -> list[Trial] | None:
    """``count`` trials per kind of :data:`REMOTE_KINDS` on host h2 of a testbed brought up (and down) here:
    network namespaces over SSH, or Docker containers. The trials run side by side (each its own op, tag and
    victim); None (printed why) when the testbed cannot be built."""
    state = Path(tempfile.mkdtemp(prefix="mlchaos-trials-tb-"))
    docker = testbed == "docker"
    flags = {"ssh": [], "docker": ["--docker"], "slurm": ["--slurm"]}[testbed]
    up = subprocess.run(
        [*CLI, "testbed", "up", "--hosts", "3" if docker else "2", *flags, "--state-dir", str(state)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        if up.returncode != 0:
            print(f"testbed up failed: {up.stdout[-500:]}{up.stderr[-500:]}")
            return None
        inventory = Path(up.stdout.strip().splitlines()[-1])
        plan = [
            (kind, i, random.Random(f"{seed}-{kind}-{'d' if docker else 'n'}h2-{i}"))
            for kind in REMOTE_KINDS
            for i in range(count)
            if testbed != "slurm"
        ]
        trials = []
        with ThreadPoolExecutor(max_workers=len(REMOTE_KINDS)) as pool:
            for trial in pool.map(lambda item: run_remote_trial(*item, inventory), plan):
                print(trial.line(), flush=True)
                trials.append(trial)
        one_at_a_time = {"ssh": (), "docker": CONTAINER_KINDS, "slurm": SLURM_KINDS}[testbed]
        for kind in one_at_a_time:
            host = "h3" if docker else "h2"
            for i in range(count):
                trials.append(run_remote_trial(kind, i, random.Random(f"{seed}-{kind}-{host}-{i}"), inventory, host))
                print(trials[-1].line(), flush=True)
        return trials
    finally:
        subprocess.run(
            [*CLI, "testbed", "down", *[f for f in flags if f != "--slurm"], "--state-dir", str(state)],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials-per-kind", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--parallel", type=int, default=4, help="trials at once (each is mostly waiting)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--remote-trials",
        type=int,
        default=0,
        help="also this many trials per remote kind on a namespace testbed host (brought up here)",
    )
    parser.add_argument(
        "--slurm-trials",
        type=int,
        default=0,
        help="also this many trials per Slurm node kind on a Slurm testbed (brought up here)",
    )
    parser.add_argument(
        "--docker-trials",
        type=int,
        default=0,
        help="also this many trials per remote kind on a container testbed host (brought up here)",
    )
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kind(s) {', '.join(unknown)}: choose from {', '.join(KINDS)}")
    plan = [(kind, i, random.Random(f"{args.seed}-{kind}-{i}")) for kind in kinds for i in range(args.trials_per_kind)]
    print(f"{len(plan)} trials ({', '.join(kinds)}), {args.parallel} at once, seed {args.seed}", flush=True)
    trials: list[Trial] = []
    # One root qdisc per interface: two bandwidth faults on lo at once, and the second fails (cleanly, nothing
    # applied: NLM_F_REPLACE needed). So those trials run one at a time, the others side by side.
    serial = [item for item in plan if item[0] in SERIAL_KINDS]
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        for trial in pool.map(lambda item: run_trial(*item), [item for item in plan if item not in serial]):
            print(trial.line(), flush=True)
            trials.append(trial)
    for item in serial:
        trials.append(run_trial(*item))
        print(trials[-1].line(), flush=True)
    for kind, count in (("ssh", args.remote_trials), ("docker", args.docker_trials), ("slurm", args.slurm_trials)):
        if count:
            done = _testbed_trials(kind, count, args.seed)
            if done is None:
                return 1
            trials += done
            kinds += sorted({t.kind for t in done})
    summary = {
        kind: {
            "trials": sum(t.kind == kind for t in trials),
            "clean": sum(t.kind == kind and not t.left for t in trials),
            "healed_by": sorted({str(t.healed_by) for t in trials if t.kind == kind}),
        }
        for kind in kinds
    }
    clean = sum(not t.left for t in trials)
    print(f"{clean}/{len(trials)} trials left nothing behind")
    if args.json:
        print(json.dumps({"trials": len(trials), "clean": clean, "per_kind": summary}))
    return 0 if clean == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
