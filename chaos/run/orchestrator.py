"""The only orchestrator: load -> plan -> setup -> run -> heal (finally) -> golden -> check -> report.

Guarantees:
- Before anything is applied, the preflight (:mod:`chaos.spec.preflight`, ``mlchaos validate``) and then every
  fault's capabilities on every host it may hit are checked: a run is refused.
- Every fault is journaled (fsync) and covered by a detached dead-man reverter BEFORE the world changes, which
  fires by the run's deadline (its clock's start + max_duration) + heal_grace at the latest; heal runs in
  ``finally`` in reverse order, also on SIGINT/SIGTERM, which wait while a fault is applied or healed.
- A stalled run is ended (``runner.no_progress``); the ``progress`` check fails it from its history (no verdicts here).
- Targets are asked for optional abilities (:mod:`chaos.targets.base`), never for their type.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from chaos import event_kinds as kinds
from chaos.checks.base import CheckResult
from chaos.checks.progress import CHECK_PROGRESS
from chaos.cluster.base import TransportError
from chaos.cluster.hosts import LOCAL, HostsError, HostSet
from chaos.cluster.local import LocalTransport
from chaos.detect import hang_watch, link_probe
from chaos.history.timeline import Event, History
from chaos.load.driver import LoadDriver
from chaos.plan.agent_plan import ENV_PLAN
from chaos.plan.build import Plan, PlannedOp, fault_op, make_plan
from chaos.plugins import registry
from chaos.plugins.injector import InjectionContext, Unsupported
from chaos.report.files import write_reports
from chaos.run.control import Order, RunControl
from chaos.run.fault_env import fault_env
from chaos.run.golden import Golden, golden_outcome
from chaos.run.in_job import digest_interval, in_job_plan
from chaos.run.lifecycle import FAULT_FAILURES, ActiveFault, FaultSession, parallel, quiet
from chaos.run.result import EXIT_FAIL, EXIT_HARNESS, EXIT_INVALID, EXIT_PASS, RunResult, RunStatus, Verdict
from chaos.run.triggers import Triggers, not_fired, placed, polled
from chaos.safety.cleanup import heal_leftovers
from chaos.safety.journal import Journal
from chaos.safety.signals import signals_deferred, signals_deferred_during, signals_raise
from chaos.spec.preflight import preflight, unsupported
from chaos.spec.preflight import refusal as refusal_text
from chaos.spec.scenario import FaultSpec, HostSelector, Scenario, ScenarioError
from chaos.targets.base import AwaitsReady, Preflight, RankPlacement, ReplicaPlacement, Serves, TargetUnusable
from chaos.targets.factory import TargetSpecError, make_target, on_nodes

POLL_S = 0.05


def rank_of(fault: FaultSpec) -> int | None:
    """The training rank that decides a fault's host: ``hosts.rank``, or (no ``hosts``) a ``rank`` param."""
    if fault.hosts is not None:
        return fault.hosts.rank
    rank = getattr(fault.params, "rank", None)
    return rank if isinstance(rank, int) else None


class RunRefused(Exception):
    """The run cannot start here (a fault is unsupported, a target is missing); nothing was applied."""


class RunInterrupted(Exception):
    """SIGTERM/SIGHUP reached the harness; raised in the main thread so ``finally`` heals."""


@dataclass
class RunOptions:
    """How to run: where reports go, seed override, golden-run policy, safety overrides."""

    report_root: Path = Path("reports")
    seed: int | None = None
    golden: bool = True
    golden_cache: bool = True
    scenario_file: Path | None = None
    inventory: Path | None = None
    nodes: HostSelector | None = None  # run a torchrun target across these inventory hosts (--nodes)
    control: RunControl | None = None  # operator commands (game day): inject now, heal all, abort, note


Listener = Callable[[str], None]
StatusListener = Callable[[RunStatus], None]


@dataclass(eq=False)
class Execution:
    """One run in progress (a target, a journal, a history); public for tests and benchmarks: use :func:`execute`."""

    scenario: Scenario
    plan: Plan
    run_dir: Path
    history: History
    log: Listener
    status: StatusListener
    hosts: HostSet
    control: RunControl | None = None

    def __post_init__(self) -> None:
        scenario, run_dir = self.scenario, self.run_dir
        self.transport = LocalTransport()
        self.journal = Journal.for_run(run_dir.name)
        claims, every = scenario.target.type == "torchrun", digest_interval(scenario)
        self.in_job, plan_file = in_job_plan(self.plan, run_dir, claims=claims, digest_every=every)
        # detect.hang when the target asks for it; an all_waiting one (no rank is odd) has the links probed
        watch = hang_watch.for_scenario(scenario, run_dir)
        self.hang_watch = link_probe.attach(watch, self.history, self.hosts, self.log)
        env = {ENV_PLAN: str(plan_file), **hang_watch.job_env(self.hang_watch), **fault_env(scenario, run_dir)}
        self.target = make_target(scenario, self.transport, run_dir, self.plan.seed, env, self.hosts)
        self.ctx = InjectionContext(self.transport, history=self.history, target=self.target, run_dir=run_dir)
        self.load = LoadDriver(scenario.load, self.history, self.plan.seed) if scenario.load is not None else None
        self.pending: list[PlannedOp] = [op for op in self.plan.ops if op not in self.in_job]
        self.faults = FaultSession(self.journal, scenario.safety, self._ctx, history=self.history, log=self.log)
        self.fired, self.ended_by = 0, ""
        self.step: int | None = None
        self.triggers = Triggers()
        self.rank_hosts: dict[int, str] = {}  # each rank's host, from its target.start
        self._lock = threading.Lock()  # the fired counter: per-host applies run in threads

    # -- setup -------------------------------------------------------------------------------------------
    def refuse_unsupported(self) -> None:
        """Probe every target node and every fault on every host it may hit, before anything starts;
        RunRefused says why not (an unreachable host or a missing container is named here, not mid-run)."""
        if isinstance(self.target, Preflight):
            try:
                self.target.preflight()
            except TargetUnusable as exc:
                raise RunRefused(str(exc)) from None
        for fault in self.scenario.faults:  # the scenario's own rules were checked by preflight() in execute
            injector = registry.injector(fault.type)
            first_op = next((op for op in self.plan.ops if op.fault == fault.name), None)
            try:
                if rank_of(fault) is not None and isinstance(self.target, RankPlacement):
                    names = self.target.node_names()  # the rank may land on any of them
                    self.hosts.refuse_protected(fault, names)
                elif (placed := self._replica_host(fault)) is not None:
                    names = [placed]
                    self.hosts.refuse_protected(fault, names)
                else:
                    names = self.hosts.resolve(fault, first_op.op_id if first_op else fault.name, self.plan.seed)
                for name in names:
                    injector.check(self._ctx(name), fault.params)
            except Unsupported as exc:
                raise RunRefused(unsupported(fault, exc)) from None
            except (HostsError, TransportError) as exc:
                raise RunRefused(f"fault {fault.name!r} ({fault.type}): {exc}") from None

    def _hosts_of(self, fault: FaultSpec, op_id: str) -> list[str]:
        """Where an op lands now. A rank (``hosts: {rank: R}``, or a process fault's ``rank`` param without
        ``hosts``) of a job spread over hosts means the host that runs that rank at this moment."""
        rank = rank_of(fault)
        if rank is not None and isinstance(self.target, RankPlacement):
            host = self.target.host_for_rank(rank)
            if host is None:
                raise HostsError(f"rank {rank} has not reported a start yet, so its host is unknown")
            self.hosts.refuse_protected(fault, [host])
            return [host]
        placed = self._replica_host(fault)
        if placed is not None:
            self.hosts.refuse_protected(fault, [placed])
            return [placed]
        return self.hosts.resolve(fault, op_id, self.plan.seed)

    def _replica_host(self, fault: FaultSpec) -> str | None:
        """The host of the replica a process fault selects (``params.replica``) on a target that places its
        replicas on hosts, when the fault names no ``hosts:`` of its own; else None."""
        replica = getattr(fault.params, "replica", None)
        if fault.hosts is not None or not isinstance(replica, str) or not isinstance(self.target, ReplicaPlacement):
            return None
        return self.target.host_for_replica(replica)

    def _ctx(self, host: str) -> InjectionContext:
        if host == LOCAL:
            return self.ctx
        extras: dict[str, object] = {"host": host, "inventory": self.hosts.inventory}
        transport = self.hosts.transport(host)
        return InjectionContext(
            transport, history=self.history, target=self.target, extras=extras, run_dir=self.run_dir
        )

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> None:
        """Start the target and drive the run until it ends. A target with a ``ready_event`` (a serving stack)
        starts the fault clock and the load when that event arrives; any other target starts both at once.
        A run with a load ends when the load has finished."""
        safety = self.scenario.safety
        run_began = time.monotonic()
        self.target.start()
        self.history.record(kinds.RUNNER_TARGET_STARTED, target=self.target.describe())
        ready_kind = self.target.ready_event if isinstance(self.target, AwaitsReady) else None
        started: float | None = None if ready_kind else self._clock_start()
        last_progress = run_began
        while True:
            now = time.monotonic()
            if self.control is not None and not self._obey(self.control.drain()):
                return
            exited = False
            for event in [*self.target.poll_events(), *hang_watch.poll(self.hang_watch)]:
                event = placed(event, self.rank_hosts)
                self.history.append(event)
                exited = exited or event.kind == kinds.TARGET_EXIT
                if event.kind in (kinds.TARGET_STEP, kinds.TARGET_START, kinds.TARGET_WORKER):
                    last_progress = now  # a rank's (re)start counts too: a slow start or restart is no stall
                    step = event.get_int("step")
                    if step is not None:
                        self.step = step if self.step is None else max(self.step, step)
                if started is None and event.kind == ready_kind:
                    started = last_progress = self._clock_start()
                self._on_event(event)
                if any(event.matches(pattern) for pattern in safety.abort_on):
                    self._end(f"abort: {event.kind} matched safety.abort_on")
                    return
            if exited:
                self._end(f"target exited ({self.target.exit_code()})")
                return
            if self.load is not None and self.load.finished():
                self._end("load finished")
                return
            if self.load is not None and self.load.started:
                last_progress = max(last_progress, self.load.last_activity)
            if started is None:  # still waiting for the target to be ready: no faults yet
                if now - run_began > safety.max_duration:
                    self._end(f"max_duration {safety.max_duration:g}s reached before the target was ready")
                    return
                if safety.no_progress_timeout is not None and now - run_began > safety.no_progress_timeout:
                    self.history.record(kinds.RUNNER_NO_PROGRESS, seconds=round(now - run_began, 3), step=None)
                    self._end(
                        f"no progress: the target was not ready ({ready_kind}) within {safety.no_progress_timeout:g}s"
                    )
                    return
                time.sleep(POLL_S)
                continue
            elapsed = now - started
            for op in self.triggers.due_at(self.pending, elapsed):
                self._fire(op)
            due = self.faults.due(now)
            if due:
                parallel([partial(self._heal, active) for active in due])
            self.faults.renew(now)  # duration-less faults' dead-men
            if elapsed > safety.max_duration:
                self._end(f"max_duration {safety.max_duration:g}s reached")
                return
            timeout = safety.no_progress_timeout
            if timeout is not None and now - last_progress > timeout:
                self.history.record(kinds.RUNNER_NO_PROGRESS, seconds=round(now - last_progress, 3), step=self.step)
                self._end(f"no progress: no target.step or rank start for {timeout:g}s")
                return
            self.status(
                RunStatus(elapsed, self.step, [a.op.op_id for a in self.active], self.fired, len(self.plan.ops))
            )
            time.sleep(POLL_S)

    def _clock_start(self) -> float:
        """The fault clock starts now (``trigger.after`` counts from here); so does the load, if any."""
        if self.load is not None:
            spec = self.load.start(self.target.url if isinstance(self.target, Serves) else None)
            self.history.record(kinds.RUNNER_LOAD_STARTED, url=spec.url, rate=spec.rate, duration_s=spec.duration)
            self.log(f"load: {spec.rate:g} req/s {spec.method} {spec.url} for {spec.duration:g}s")
        # the run's deadline: every dead-man fires by then + grace
        self.faults.ends_at = time.monotonic() + self.scenario.safety.max_duration
        return self.faults.ends_at - self.scenario.safety.max_duration

    def _obey(self, orders: list[Order]) -> bool:
        """Carry out operator commands in order; False when one ended the run."""
        for order in orders:
            if order.command == "note":
                self.history.record(kinds.RUNNER_NOTE, text=order.text, author=order.author)
                continue
            self.history.record(kinds.RUNNER_OPERATOR, command=order.command, text=order.text, author=order.author)
            if order.command == "abort":
                self._end(f"aborted by the operator: {order.text}" if order.text else "aborted by the operator")
                return False
            if order.command == "heal_all":
                self.log(f"operator: heal all ({len(self.active)} active)")
                parallel([partial(self._heal, active) for active in list(self.active)])
            elif order.command == "inject_next":
                upcoming = sorted(self.pending, key=lambda op: (op.at_s is None, op.at_s or 0.0))
                if not upcoming:
                    self.log("operator: inject next: no fault is pending")
                    continue
                self.log(f"operator: inject {upcoming[0].op_id} now")
                self._fire(upcoming[0])
        return True

    def stop_load(self) -> None:
        if self.load is not None:
            self.load.stop()

    def stop_target(self, grace: float) -> None:
        """Stop the job; when it is still running, first record ``runner.stop`` {reason} (why the run ended, or
        the exception ending it), so ``completes`` tells the harness's stop from the job's own failure."""
        if self.target.exit_code() is None:
            in_flight = sys.exc_info()[1]  # set while an interrupt or a harness error unwinds through finally
            reason = self.ended_by or (f"{type(in_flight).__name__}: {in_flight}" if in_flight else "run ended")
            self.history.record(kinds.RUNNER_STOP, reason=reason, grace_s=grace)
        self.target.stop(grace=grace)

    def _end(self, why: str) -> None:
        self.ended_by = why
        self.history.record(kinds.RUNNER_END, reason=why)
        for event in not_fired(self.pending, self.step, why, self.triggers.claims):
            self.history.append(event)
            self.log(f"fault {event.get_str('op')} never fired: {event.get_str('reason')}")
        self.log(f"run ended: {why}")

    def _on_event(self, event: Event) -> None:
        if event.kind == kinds.FAULT_APPLIED and event.source == "target":
            self.fired += 1  # an in-job fault, or a claimed one, fired by the job's agent
            self.pending = [op for op in self.pending if op.op_id != event.get_str("op")]
            self.log(f"fault applied in the job: {event.get_str('description') or event.get_str('op')}")
        elif event.kind.startswith("detect."):
            where = f" on rank {event.rank}" if event.rank is not None else ""
            self.log(f"detected: {event.kind}{where}")
        elif event.kind == kinds.TARGET_RESTART:
            self.log(f"target restarted (attempt {event.get_int('attempt')})")
        for op in self.triggers.due_on(self.pending, event):
            self._fire(op)

    # -- faults ------------------------------------------------------------------------------------------
    @signals_deferred_during  # every host's apply recorded and registered before a signal's heal
    def _fire(self, op: PlannedOp) -> None:
        radius = self.scenario.safety.blast_radius
        if radius is not None and len(self.active) >= radius:
            return  # stays pending: fires once an active fault heals
        self.pending.remove(op)
        try:
            hosts = self._hosts_of(self.scenario.fault(op.fault), op.op_id)
        except HostsError as exc:
            self.history.record(kinds.FAULT_FAILED, fault=op.fault, op=op.op_id, injector=op.injector, error=str(exc))
            self.log(f"fault {op.op_id} has no host: {exc}")
            return
        parallel([partial(self._fire_on, op, h, op.op_id if h == LOCAL else f"{op.op_id}@{h}") for h in hosts])

    def _fire_on(self, op: PlannedOp, host: str, journal_id: str) -> None:
        placeholders = {"run_dir": str(self.run_dir.resolve()), "seed": str(self.plan.seed)}
        try:
            self.faults.fire(
                registry.injector(op.injector),
                fault_op(op, self.scenario, placeholders),
                host=host,
                journal_id=journal_id,
                details=polled(op, self.step, POLL_S, self.triggers),
            )
        except FAULT_FAILURES:
            return  # recorded as fault.failed and logged; the run goes on without it
        with self._lock:
            self.fired += 1

    @property
    def active(self) -> list[ActiveFault]:
        """The faults the harness applied and has not healed yet."""
        return self.faults.active

    @signals_deferred_during  # healed, unregistered and recorded together
    def _heal(self, active: ActiveFault) -> None:
        self.faults.heal(active)

    def heal_all(self) -> list[str]:
        """Heal every active fault, newest first, then anything the journal still lists as unhealed; returns
        errors, never stops early."""
        return self.faults.heal_all()


def _golden(scenario: Scenario, options: RunOptions, log: Listener) -> Golden | None:
    """The golden outcome for this run (cached under ``<report root>/.golden``); a cache miss runs the job
    again without faults, with this run's inventory (its nodes are already in the scenario's target)."""

    def run_fault_free(fault_free: Scenario, report_root: Path) -> RunResult:
        golden_options = RunOptions(
            report_root=report_root, golden=False, inventory=options.inventory, scenario_file=options.scenario_file
        )
        return execute(fault_free, golden_options, log=quiet)

    return golden_outcome(
        scenario,
        options.report_root / ".golden",
        use_cache=options.golden_cache,
        run_fault_free=run_fault_free,
        log=log,
    )


def new_run_dir(root: Path, name: str) -> Path:
    """A fresh, ABSOLUTE run folder under ``root``: the job's processes get it as ``{run_dir}`` and the plan
    file's path, and on other hosts (SSH, containers) they do not start in the harness's working directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = root.absolute() / f"{name}-{stamp}-{secrets.token_hex(2)}"
    run_dir.mkdir(parents=True, exist_ok=False)
    return run_dir


def _refused(
    scenario: Scenario, plan: Plan, run_dir: Path, history: History, reason: str, options: RunOptions
) -> RunResult:
    """The result of a run refused before anything started (exit 2, reports written)."""
    history.record(kinds.RUNNER_REFUSED, reason=reason)
    history.close()
    result = RunResult(scenario, plan, run_dir, history, [], "error", EXIT_INVALID, "refused", reason)
    if options.scenario_file is not None:
        result.extra["scenario_file"] = str(options.scenario_file)  # so the report's replay line names it
    write_reports(result)
    return result


def execute(
    scenario: Scenario,
    options: RunOptions | None = None,
    *,
    log: Listener = quiet,
    status: StatusListener = quiet,
) -> RunResult:
    """Run ``scenario`` once end to end and write its reports. Never leaves a fault applied."""
    options = options or RunOptions()
    refusal = ""
    if options.nodes is not None:
        try:
            scenario = on_nodes(scenario, options.nodes)
        except TargetSpecError as exc:
            refusal = str(exc)
    # The preflight `mlchaos validate` runs: a scenario built in code (or moved by --nodes) is refused here.
    refusal = refusal or refusal_text(preflight(scenario))
    plan = make_plan(scenario, options.seed)
    run_dir = new_run_dir(options.report_root, scenario.name)
    history = History(run_dir / "history.jsonl")
    history.record(kinds.RUNNER_START, scenario=scenario.name, seed=plan.seed, pid=os.getpid())
    base_dir = options.scenario_file.parent if options.scenario_file is not None else None
    if refusal:
        return _refused(scenario, plan, run_dir, history, refusal, options)
    try:
        hosts = HostSet.for_scenario(scenario, options.inventory, base_dir)
    except (HostsError, ScenarioError) as exc:
        return _refused(scenario, plan, run_dir, history, str(exc), options)
    # Before this run's own journal exists: heal what dead runs left (live runs' journals are locked).
    for line in heal_leftovers(hosts.all_transports(), log=log):
        history.record(kinds.RUNNER_LEFTOVER_HEALED, detail=line)
    try:
        execution = Execution(scenario, plan, run_dir, history, log, status, hosts, options.control)
    except HostsError as exc:
        hosts.close()
        return _refused(scenario, plan, run_dir, history, str(exc), options)
    error = ""
    heal_errors: list[str] = []
    exit_code = EXIT_PASS
    try:
        with signals_raise(RunInterrupted):
            execution.refuse_unsupported()
            try:
                execution.run()
            finally:
                with signals_deferred():  # a second signal waits until all is healed and the job stopped
                    execution.stop_load()
                    heal_errors = execution.heal_all()
                    execution.stop_target(grace=10.0)
                    for event in execution.target.poll_events():
                        history.append(event)
    except RunRefused as exc:
        error, exit_code = str(exc), EXIT_INVALID
        execution.ended_by = "refused"
        history.record(kinds.RUNNER_REFUSED, reason=error)
    except (KeyboardInterrupt, RunInterrupted) as exc:
        error, exit_code = f"interrupted ({type(exc).__name__} {exc}); faults healed", EXIT_HARNESS
        execution.ended_by = "interrupted"
        history.record(kinds.RUNNER_INTERRUPTED, reason=str(exc))
    except Exception as exc:
        error, exit_code = f"harness error: {type(exc).__name__}: {exc}", EXIT_HARNESS
        execution.ended_by = execution.ended_by or "harness error"
        history.record(kinds.RUNNER_ERROR, error=str(exc)[:1000])
    finally:
        execution.journal.archive()
        hosts.close()
    if heal_errors:
        error = (error + "; " if error else "") + "heal failed: " + "; ".join(heal_errors)
        exit_code = EXIT_HARNESS
    golden: str | None = None
    results: list[CheckResult] = []
    if exit_code == EXIT_PASS:
        checks = registry.checks()
        if options.golden and any(checks[c.type].needs_golden for c in scenario.checks):
            outcome = _golden(scenario, options, log)
            if outcome is not None:
                golden = outcome.digest
                history.record(
                    kinds.RUNNER_GOLDEN,
                    digest=outcome.digest,
                    digests=outcome.digests_json(),  # every rank's, so checks compare every rank
                    detections=list(outcome.detections),
                    cached=outcome.cached,
                )
        results = evaluate(history, scenario)
        failed = [r for r in results if r.status == "fail" or (r.status == "unknown" and not scenario.allow_unknown)]
        exit_code = EXIT_FAIL if failed else EXIT_PASS
    verdict: Verdict = "pass" if exit_code == EXIT_PASS else "fail" if exit_code == EXIT_FAIL else "error"
    history.record(kinds.RUNNER_VERDICT, verdict=verdict, exit_code=exit_code)
    history.close()
    result = RunResult(scenario, plan, run_dir, history, results, verdict, exit_code, execution.ended_by, error, golden)
    if options.scenario_file is not None:
        result.extra["scenario_file"] = str(options.scenario_file)
    write_reports(result)
    return result


def evaluate(history: History, scenario: Scenario) -> list[CheckResult]:
    """Run every check of ``scenario`` over ``history`` (pure: no target access), then the ``progress`` check
    when the scenario does not name it, kept only when it fails: a stalled run fails whatever was asked."""
    checks = registry.checks()
    results = []
    for spec in scenario.checks:
        result = checks[spec.type].evaluate(history, spec.params, scenario)
        results.append(result.model_copy(update={"name": spec.name or result.name}))
    if not any(spec.type == CHECK_PROGRESS for spec in scenario.checks):
        progress = checks[CHECK_PROGRESS]
        implicit = progress.evaluate(history, progress.Params(), scenario)
        results += [implicit] if implicit.status == "fail" else []
    return results
