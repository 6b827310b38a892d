"""torch's own failure signatures, read from a job's output: detections for a script nobody edited for mlchaos.

A training process says what went wrong before it dies: gloo's ``Timed out waiting 10000ms for recv operation``,
a peer's ``Connection reset by peer``, ``CUDA out of memory``, the traceback that ends a worker, and torchrun
logs the failure and the restart. Each :class:`Signature` turns such a line into a ``detect.*`` (or ``target.*``)
event, on the rank that printed it: once a process group exists torch prefixes a rank's uncaught traceback and
its C++ log lines with ``[rankN]:``, and the event takes its rank from that prefix (see :class:`LogMatcher`).

The kinds follow the detection checks' evidence rule (:mod:`chaos.checks.detection`): a survivor's collective
timeout or lost peer is a group-level detection (``detect.collective_timeout`` / ``detect.collective_error`` /
``detect.peer_lost``: the reporter is not the culprit), an out-of-memory or a traceback names the rank itself.
Each line becomes at most one event: the signatures are tried in table order and the first that matches wins,
so a gloo timeout's exception line is a ``collective_timeout``, never also a ``worker_error``.

torchft's quorum that lost a replica group (:mod:`chaos.history.torchft_signatures`, named ``torchft_quorum``)
is read with them. Targets read them by default (``signatures: all``); ``signatures: none`` turns them off and a list keeps only
the named ones. The scenario's own ``matchers:`` are read besides them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from chaos.event_kinds import (
    DETECT_COLLECTIVE_ERROR,
    DETECT_COLLECTIVE_TIMEOUT,
    DETECT_OOM,
    DETECT_PEER_LOST,
    DETECT_RENDEZVOUS_ERROR,
    DETECT_WORKER_ERROR,
    DETECT_WORKER_EXIT,
    TARGET_AGENT_RESTART,
    TARGET_RENDEZVOUS,
)
from chaos.history import torchft_signatures
from chaos.history.timeline import Event, LineMatcher, LogMatcher


@dataclass(frozen=True)
class Signature:
    """One failure signature: a regex over a line (after any ``[rankN]:`` prefix) and the event it becomes."""

    name: str
    kind: str
    pattern: str
    meaning: str
    detector: str = "torch_output"
    source: str = "log"

    def matcher(self) -> LogMatcher:
        fixed = {"detector": self.detector, "signature": self.name}
        return LogMatcher(self.pattern, self.kind, source=self.source, fixed=fixed)


SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "gloo_timeout",
        DETECT_COLLECTIVE_TIMEOUT,
        r"Timed out waiting (?P<timeout_ms>\d+)ms for (?P<op>\w+) operation",
        "gloo gave up on a collective at the process-group timeout (a peer is frozen, gone or cut off)",
        detector="gloo",
    ),
    Signature(
        "nccl_watchdog",
        DETECT_COLLECTIVE_TIMEOUT,
        r"Watchdog caught collective operation timeout(?:.*?Timeout\(ms\)=(?P<timeout_ms>\d+))?",
        "NCCL's watchdog found a collective past the process-group timeout",
        detector="nccl",
    ),
    Signature(
        "nccl_error",
        DETECT_COLLECTIVE_ERROR,
        r"NCCL (?:error|communicator was aborted)|ncclSystemError|ncclRemoteError|ncclInternalError",
        "NCCL reported a failed or aborted communicator",
        detector="nccl",
    ),
    Signature(
        "peer_lost",
        DETECT_PEER_LOST,
        r"^(?:\[rank\d+\]:|.*?gloo).*?(?:\[(?P<peer>[0-9a-fA-F.:]+)\]:\d+:? )?"
        r"(?:Connection (?:reset|closed) by peer|Broken pipe)",
        "a collective's connection to a peer broke: the peer died or was cut off (gloo, or a rank's traceback)",
        detector="gloo",
    ),
    Signature(
        "connect_failed",
        DETECT_PEER_LOST,
        r"connectFullMesh failed|DistNetworkError|client socket has failed to connect|Socket Timeout",
        "the process group or its store could not (re)connect to its peers",
        detector="c10d",
    ),
    Signature(
        "out_of_memory",
        DETECT_OOM,
        r"CUDA out of memory|OutOfMemoryError|DefaultCPUAllocator: can't allocate memory",
        "the rank ran out of GPU or host memory",
    ),
    Signature(
        "worker_error",
        DETECT_WORKER_ERROR,
        r"^\[rank\d+\]:\s?(?P<error>(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt)\b.*)$",
        "the exception that ended a rank (the last line of its traceback, as torch prints it)",
    ),
    Signature(
        "torchrun_worker_failed",
        DETECT_WORKER_EXIT,
        r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<rank>\d+) \(pid: (?P<pid>\d+)\)",
        "torchrun's elastic agent saw a worker exit with an error",
        detector="torchrun",
        source="torchrun",
    ),
    Signature(
        "torchrun_rendezvous",
        TARGET_RENDEZVOUS,
        r"\] \[(?P<role>[\w-]+)\] Rendezvous complete for workers",
        "torchrun's elastic agent completed a rendezvous round (logged at INFO)",
        detector="torchrun",
        source="torchrun",
    ),
    Signature(
        "rendezvous_error",
        DETECT_RENDEZVOUS_ERROR,
        r"(?P<error>\b(?:[\w.]+\.)?(?:Rendezvous(?:Closed|Timeout|Connection|State)Error|EtcdRendezvousRetryableFailure)"
        r"\b.*)$",
        "an agent's rendezvous failed: its store unreachable, the round timed out or was closed",
        detector="torchrun",
        source="torchrun",
    ),
    Signature(
        "torchrun_restart",
        TARGET_AGENT_RESTART,
        r"Worker group (?P<state>FAILED|UNHEALTHY)\. (?P<attempts_left>\d+)/(?P<max_restarts>\d+) attempts left",
        "torchrun restarts its worker group",
        detector="torchrun",
        source="torchrun",
    ),
)
NAMES = (*(signature.name for signature in SIGNATURES), torchft_signatures.NAME)  # torchft's: its own module

SignatureChoice = Literal["all", "none"] | list[str]


def chosen(choice: SignatureChoice) -> list[Signature]:
    """The signatures a target's ``signatures:`` keeps, in table order (names are checked by the spec)."""
    if choice == "all":
        return list(SIGNATURES)
    if choice == "none":
        return []
    keep = set(choice)
    return [signature for signature in SIGNATURES if signature.name in keep]


def unknown_names(names: Iterable[str]) -> list[str]:
    """The names that are not signatures (for the spec's error message)."""
    return [name for name in names if name not in NAMES]


class FirstMatch:
    """Several matchers read as one: the first that matches a line makes its event (at most one per line)."""

    def __init__(self, matchers: Sequence[LineMatcher]) -> None:
        self.matchers = list(matchers)

    def match(self, line: str, ts_ns: int) -> Event | None:
        for matcher in self.matchers:
            event = matcher.match(line, ts_ns)
            if event is not None:
                return event
        return None


def signature_matcher(choice: SignatureChoice = "all") -> FirstMatch:
    """The chosen signatures as one line matcher (with torchft's lost-replica reading when chosen: it keeps the
    previous quorum, so one matcher reads one replica group's output)."""
    found: list[LineMatcher] = [signature.matcher() for signature in chosen(choice)]
    if choice == "all" or (choice != "none" and torchft_signatures.NAME in choice):
        found.append(torchft_signatures.TorchftQuorum())
    return FirstMatch(found)
