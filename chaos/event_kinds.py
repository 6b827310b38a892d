"""Every event kind a run's history can hold, declared once: the vocabulary recorders and checks share.

An event is ``{"kind": "family.name", "source", "rank", "data": {...}}`` (:class:`chaos.history.timeline.Event`).
Each kind below names its recorder and its ``data`` keys (``?``: not always present; ``rank`` is the event's own
field, never a data key). Standard library only and importing nothing of mlchaos, like :mod:`chaos.events`: a
training process may import it. ``tests/unit/test_event_vocabulary.py`` fails when a kind is declared anywhere
else, or when a recorder writes a kind missing here. ``detect.*`` stays an open family for a job's own detectors
and a scenario's ``matchers:``; the kinds here are the ones mlchaos itself writes or reads.
"""

from __future__ import annotations

from typing import Final, Literal, NotRequired, TypedDict

# -- fault.*: a fault's life, from the harness (chaos.run.orchestrator) or a rank's in-job agent ----------------
FAULT_APPLIED: Final = "fault.applied"  # FaultAppliedData below
FAULT_HEALED: Final = "fault.healed"  # FaultHealedData below
FAULT_FAILED: Final = "fault.failed"  # FaultFailedData below
# injectors.process.holds: a process another fault also holds {fault, op, injector, host, phase: apply|heal,
# with (the other op ids), pids, stays_stopped, description}
FAULT_OVERLAP: Final = "fault.overlap"
# chaos.run.triggers: an op still waiting for its trigger when the run ended {fault, op, trigger, reason}
FAULT_NOT_FIRED: Final = "fault.not_fired"
# chaos.injob.phase_faults: a rank's agent fires this at_step op itself, at the step's start {fault, op, at_step}
FAULT_CLAIMED: Final = "fault.claimed"
# injectors.checkpoint: what a checkpoint fault did to the files {fault, op, injector, host, mode, path,
# checkpoint?, step?, and per mode: offsets, size, stale, current, current_step, at_bytes, pid, torn}
FAULT_CHECKPOINT: Final = "fault.checkpoint"
# chaos.injob.tensor_faults: one corruption of a tensor {step, where, target, corruption, indices, detail, state?}
FAULT_TENSOR: Final = "fault.tensor"

# -- target.*: the job's progress, from the job (chaos.events.emit: the agent, the reference jobs) ------------
TARGET_START: Final = "target.start"  # TargetStartData below
TARGET_STEP: Final = "target.step"  # TargetStepData below
# chaos.injob.progress, reference checkpoint store: {step, path, attempt, seen? | duration_s?, files?, manifest?}
TARGET_CHECKPOINT: Final = "target.checkpoint"
# chaos.injob.progress, reference checkpoint store: {step, attempt, path, seen? | verified?, rejected?}
TARGET_RESUME: Final = "target.resume"
TARGET_DIGEST: Final = "target.digest"  # the model state's hash: agent, reference trainer {digest, step, attempt}
TARGET_STEP_SKIPPED: Final = "target.step_skipped"  # chaos.agent: a skip fault held back the optimizer step {step}
# chaos.injob.loop_hooks, the bootstrap sitecustomize: steps are not exact here {exact, reason, source?, attempt?}
TARGET_STEP_SOURCE: Final = "target.step_source"
# reference checkpoint store / save retry: {step, path, duration_s, bytes}; {step, path, reason};
# {step, attempt, errno_name, error, delay_s, pid}; {step, attempts, error, errno_name}
TARGET_RESTORE: Final = "target.restore"
TARGET_CHECKPOINT_REJECTED: Final = "target.checkpoint_rejected"
TARGET_CHECKPOINT_RETRY: Final = "target.checkpoint_retry"
TARGET_CHECKPOINT_FAILED: Final = "target.checkpoint_failed"
# chaos.reference.rollback: went back to an older checkpoint {from_step, to_step, reason, detected_step,
# last_clean_step, path, policy, rollbacks, odd_ranks, removed, rejected, attempt, duration_s}
TARGET_ROLLBACK: Final = "target.rollback"

# -- target.*: the job's processes, from the targets (chaos.targets) ----------------------------------------
TARGET_EXIT: Final = "target.exit"  # TargetExitData below
TARGET_NODE_EXIT: Final = "target.node_exit"  # multi-node torchrun: one node's target.exit {code, host}
# rank discovery {restart, host, attempt?, cause, exitcode?, failed_local_rank?, failed_pid?, failed_rank?,
# group_state?}; the reference trainer {attempt}
TARGET_RESTART: Final = "target.restart"
# rank discovery: a torchrun worker in its launcher's process tree {local_rank, pid, host, group_rank?,
# world_size?, restart?, run_id?}
TARGET_WORKER: Final = "target.worker"
# torchrun's log (chaos.history.torch_signatures) {line, detector, signature, state, attempts_left, max_restarts}
TARGET_AGENT_RESTART: Final = "target.agent_restart"
# torchrun's log (chaos.history.torch_signatures): an agent's rendezvous round completed {line, detector, signature,
# host}; the multi-node agents log it at INFO (chaos.targets.torchrun_nodes)
TARGET_RENDEZVOUS: Final = "target.rendezvous"
TARGET_PORTS: Final = "target.ports"  # the ports a target serves on {ports: {name: port}, chosen}
TARGET_READY: Final = "target.ready"  # http and roles targets: the job answers {url?}
# chaos.history.torchft_signatures: a torchft replica group's manager is up {replica_id, detector}
TARGET_TORCHFT_REPLICA: Final = "target.torchft_replica"
# chaos.targets.roles: {role, replica, index, pid, attempt}; {role, replica, port, attempt}; {role, waiting_for};
# {role, replica, index, pid, code, attempt, expected}; {role, replica, attempt, delay}
TARGET_ROLE_START: Final = "target.role_start"
TARGET_ROLE_READY: Final = "target.role_ready"
TARGET_ROLE_UNREADY: Final = "target.role_unready"
TARGET_ROLE_EXIT: Final = "target.role_exit"
TARGET_ROLE_RESTART: Final = "target.role_restart"

# -- detect.*: something noticed a fault, on ``rank`` when known {detector, ...} ------------------------------
# a rank's failed collective: the agent (chaos.injob.loop_hooks) {detector, step, error}, the reference trainer
# {detector, message, step, peer?}, torch's output (chaos.history.torch_signatures) {line, detector, signature,
# timeout_ms?, op?, peer?}, torchft's quorum {lost, quorum_id, participants, detector, signature}
DETECT_COLLECTIVE_TIMEOUT: Final = "detect.collective_timeout"
DETECT_COLLECTIVE_ERROR: Final = "detect.collective_error"
DETECT_PEER_LOST: Final = "detect.peer_lost"
DETECT_OOM: Final = "detect.oom"
# torch's output: a rank's last traceback line {line, detector, signature, error}; torchrun's log: a worker
# failed {line, detector, signature, exitcode, pid}
DETECT_WORKER_ERROR: Final = "detect.worker_error"
DETECT_WORKER_EXIT: Final = "detect.worker_exit"
# torchrun's log: an agent's rendezvous failed (its store unreachable, the round timed out or closed) {line,
# detector, signature, error}
DETECT_RENDEZVOUS_ERROR: Final = "detect.rendezvous_error"
# chaos.detect.hang_watch: a collective nobody finishes {detector, culprit_rank, culprit_ranks, reason, seq, op,
# nbytes, step, index, waiting_ranks, stalled_s, hung_since_ns, evidence}
DETECT_HANG: Final = "detect.hang"
# chaos.detect.link_probe: a bad link between two ranks' hosts {detector, ranks, hosts, addresses, groups, small_ok,
# large_ok, small_bytes, large_bytes, verdict, probes, started_ns, probe_s, hang_ts_ns}
DETECT_LINK: Final = "detect.link"
# chaos.guards.checksum / torchft: a corrupted all-reduce {detector, bucket, blocks, n_blocks, step, site_hint,
# culprit_rank, ranks, attempt, action, participants?, via?}
DETECT_SDC: Final = "detect.sdc"
# chaos.guards.consistency: {detector, reporter, step, odd_ranks, culprit_rank, groups, digest, digests, tensors,
# message}; {detector, step, tensors, count}
DETECT_DIVERGENCE: Final = "detect.divergence"
DETECT_NONFINITE: Final = "detect.nonfinite"
# chaos.guards.anomaly {detector, reason, step, value, detail}; chaos.guards.straggler (rank: the straggler)
# {detector, reporter, step, window, ratio, min_excess, observed_ratio, compute_s, wait_s}
DETECT_GRAD_ANOMALY: Final = "detect.grad_anomaly"
DETECT_STRAGGLER: Final = "detect.straggler"
# reference checkpoint store: a save that does not finish {detector, step, path, elapsed_s, phase}
DETECT_CHECKPOINT_STALL: Final = "detect.checkpoint_stall"
# reference gateway {backend, reason, failures}, haproxy's log (chaos.targets.balancers) {line, proxy, backend,
# reason?}; reference gateway: a replica's answer is wrong {backend, max_abs_err, tolerance}
DETECT_BACKEND_DOWN: Final = "detect.backend_down"
DETECT_WRONG_ANSWER: Final = "detect.wrong_answer"

# -- guard.*: a guard ran and found nothing wrong ----------------------------------------------------------
# chaos.guards.consistency {detector, step, agree, digest, tensors, odd_ranks, nonfinite_ranks, every}
GUARD_CONSISTENCY: Final = "guard.consistency"

# -- serving.*: the serving stack (reference gateway and model server; chaos.targets.roles, balancers) --------
# model server {replica, pid, port, model}; roles target {role, replica, index, pid, attempt, backend}
SERVING_REPLICA_START: Final = "serving.replica_start"
SERVING_READY: Final = "serving.ready"  # gateway {url, replicas}
# gateway {backend, successes, after}; haproxy's log {line, proxy, backend, reason?}
SERVING_BACKEND_UP: Final = "serving.backend_up"
SERVING_BREAKER: Final = "serving.breaker"  # gateway {backend, state}
SERVING_ROUTE: Final = "serving.route"  # gateway {backend, previous}
SERVING_STATS: Final = "serving.stats"  # gateway, periodic {in_flight, requests, shed, served_by, route}

# -- load.*: the load generator (chaos.load.engine) -------------------------------------------------------
# {url, method, rate, pattern, arrivals, duration_s, timeout_s, max_in_flight, seed, start_ns}
LOAD_START: Final = "load.start"
# one request {i, scheduled_ns, latency_s, status, backend, degraded, priority, send_lag_s, error?, session?};
# a streaming load (chaos.load.stream) adds {stream: true, ttft_s (from the scheduled time; null: no token),
# gaps_s [s, 1 us], tokens, ended: complete | cut | error | timeout, backends [distinct, first-seen order],
# resumed, session} (a stream not complete has status "error", "timeout" or "cancelled")
LOAD_REQUEST: Final = "load.request"
# totals {scheduled, sent, responded, ok, timeouts, errors, dropped_client, cancelled, retries, connections,
# cpu_s, wall_s, max_send_lag_s, stopped_early}; streaming also {complete, cut, resumed, tokens}
LOAD_END: Final = "load.end"

# -- slurm.*: a Slurm job and its nodes as the harness polls them (chaos.targets.slurm, slurm_watch) ----------
SLURM_JOB: Final = "slurm.job"  # {job_id, state, reason, nodes, restarts, exit_code, via?}
SLURM_NODE: Final = "slurm.node"  # {node, state, reason}
SLURM_POLL_FAILED: Final = "slurm.poll_failed"  # a poll could not ask Slurm {error}

# -- storage.*: what a storage fault's FUSE layer did (injectors.storage.hits) -------------------------------
# {op_id, fault, host, op, path, mount, mode, errno_name, latency_s, count, first_ns, last_ns, times_ns}
STORAGE_HIT: Final = "storage.hit"

# -- runner.*: the harness's own milestones (chaos.run.orchestrator unless named) -----------------------------
RUNNER_START: Final = "runner.start"  # {scenario, seed, pid}
RUNNER_REFUSED: Final = "runner.refused"  # the run was refused before anything was applied {reason}
RUNNER_LEFTOVER_HEALED: Final = "runner.leftover_healed"  # a previous run's fault healed at start {detail}
RUNNER_TARGET_STARTED: Final = "runner.target_started"  # {target}
RUNNER_LOAD_STARTED: Final = "runner.load_started"  # {url, rate, duration_s}
RUNNER_NO_PROGRESS: Final = "runner.no_progress"  # the run stalled and is ended {seconds, step}
RUNNER_DEADMAN_NOT_RENEWED: Final = "runner.deadman_not_renewed"  # {detail}
RUNNER_NOTE: Final = "runner.note"  # an operator's note {text, author}
RUNNER_OPERATOR: Final = "runner.operator"  # an operator's command {command, text, author}
RUNNER_STOP: Final = "runner.stop"  # the harness stops a running job, just before signalling it {reason, grace_s}
RUNNER_END: Final = "runner.end"  # {reason}
RUNNER_INTERRUPTED: Final = "runner.interrupted"  # {reason}
RUNNER_ERROR: Final = "runner.error"  # the harness failed {error}
RUNNER_GOLDEN: Final = "runner.golden"  # the golden run's outcome {digest, digests, detections, cached}
RUNNER_VERDICT: Final = "runner.verdict"  # the last event {verdict, exit_code}
RUNNER_BAD_EVENT: Final = "runner.bad_event"  # chaos.history.timeline: an unparsable job line {line, error}
RUNNER_DISCOVERY_FAILED: Final = "runner.discovery_failed"  # rank discovery cannot scan a host {host, reason}
RUNNER_HANG_LISTENER_ERROR: Final = "runner.hang_listener_error"  # chaos.detect.hang_watch {error}
# chaos.detect.link_probe: one probe round {pairs, bad, errors, started_ns, probe_s, hang_ts_ns, results}
RUNNER_LINK_PROBE: Final = "runner.link_probe"

ALL_KINDS: Final[frozenset[str]] = frozenset(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)
"""Every kind above."""
FAMILIES: Final[frozenset[str]] = frozenset(kind.split(".", 1)[0] for kind in ALL_KINDS)
"""The event families (``fault``, ``target``, ``detect`` ...): the part of a kind before its dot."""


class FaultAppliedData(TypedDict):
    """``fault.applied``: the harness (host, duration_s, apply_s; a step trigger's fired_by, seen_step, poll_s,
    claim_lapsed) or a rank's agent (step, and what fits the fault: the phase fault's phase, pid, signal, bucket,
    site; the crash fault's phase, crash_kind, pid, bucket, site; the tensor fault's where, persistence, state; the
    gradient fault's site, bucket, indices; the hang fault's index, collective; the collective fault's index,
    collective, collective_kind, pid, and an abort's groups and connections)."""

    fault: str
    op: str
    injector: str
    description: str
    host: NotRequired[str]
    duration_s: NotRequired[float | None]
    apply_s: NotRequired[float]
    fired_by: NotRequired[str]
    seen_step: NotRequired[int | None]
    poll_s: NotRequired[float]
    claim_lapsed: NotRequired[bool]
    step: NotRequired[int]
    phase: NotRequired[str]
    pid: NotRequired[int]
    signal: NotRequired[str]
    bucket: NotRequired[int]
    site: NotRequired[str]
    indices: NotRequired[list[int]]
    where: NotRequired[str]
    persistence: NotRequired[str]
    state: NotRequired[str]
    index: NotRequired[int]
    collective: NotRequired[str]
    crash_kind: NotRequired[str]
    collective_kind: NotRequired[str]
    groups: NotRequired[int]
    connections: NotRequired[int]


class FaultHealedData(TypedDict):
    """``fault.healed``: the harness (host) or a rank's agent (step; a freeze's frozen_s and pid, a spin's spun_s;
    a tensor fault's heal and the element indices restored, delta_removed, kept)."""

    fault: str
    op: str
    injector: str
    host: NotRequired[str]
    step: NotRequired[int]
    frozen_s: NotRequired[float]
    spun_s: NotRequired[float]
    pid: NotRequired[int]
    heal: NotRequired[str]
    restored: NotRequired[list[int]]
    delta_removed: NotRequired[list[int]]
    kept: NotRequired[list[int]]


class FaultFailedData(TypedDict):
    """``fault.failed``: a fault that could not be prepared, applied or fired (nothing of it stays applied)."""

    fault: str
    op: str
    injector: str
    error: str
    host: NotRequired[str]


class TargetStartData(TypedDict):
    """``target.start``: a rank process started (the agent, the reference trainer); host? where a target adds it."""

    pid: int
    attempt: int
    world_size: NotRequired[int]
    host: NotRequired[str]


class TargetStepData(TypedDict):
    """``target.step``: a rank finished a training step (the agent, the reference trainer, the bootstrap's
    optimizer hook: source ``optimizer`` or ``torchft``; under torchft: committed, participants)."""

    step: int
    attempt: NotRequired[int]
    loss: NotRequired[float]
    samples: NotRequired[list[int | str]]
    committed: NotRequired[bool]
    participants: NotRequired[int]
    source: NotRequired[str]


class TargetExitData(TypedDict):
    """``target.exit``: the job's process (or Slurm job) ended, from its target."""

    code: int | None
    host: NotRequired[str]
    error: NotRequired[str]
    job_id: NotRequired[int]
    state: NotRequired[str]


# -- the literal types in-job faults and the scenario share --------------------------------------------------
Site = Literal["local", "in_transit", "post_reduce"]
"""Where in an all-reduce a gradient fault lands and the checksum guard looks: before checksums, on the wire,
or in the reduced result."""
TriggerPhase = Literal["forward", "allreduce", "backward", "optimizer_step"]
"""Where inside a training step a process fault fires (a scenario's ``trigger.phase``)."""
TensorPhase = Literal["forward", "backward", "optimizer_step"]
"""Where inside a training step a tensor fault fires (the loop hook at which its tensor is live)."""
