"""``restarts_at_most``: the torchrun launcher(s) used at most N restarts (``params: {restarts: N}``).

torchrun's ``--max-restarts`` is a budget per launcher (elastic agent): a run that burned three restarts and a
clean one end alike (exit 0), so the restarts actually used are counted from what the launcher itself shows,
per host (``data.host``; events without one are this machine's):

- ``target.worker`` {``restart``}: a worker found in the launcher's process tree, with the
  ``TORCHELASTIC_RESTART_COUNT`` the launcher gave it (:mod:`chaos.targets.rank_discovery`; any script);
- ``target.restart`` {``restart``, or ``node_attempt``, or ``attempt``}: the count went up (found in the tree,
  or reported by the reference trainer's rank 0);
- ``target.agent_restart`` {``attempts_left``, ``max_restarts``}: the launcher's log line ``Worker group FAILED.
  L/M attempts left`` (it logs it right before restart M - L + 1);
- ``target.start`` {``node_attempt``, or ``attempt``}: a rank's own report of the count (the reference trainer);
- ``target.role_start`` {``replica``, ``attempt``}: a ``roles`` target's supervisor (re)started a replica: its
  attempt is that replica's restarts (counted per replica, as a host's launcher is per host).

Restarts used = the highest restart number any of these shows, on the host where it is highest (a node that
re-joins after another node's failure does not spend its own budget, so hosts are not added up).
:func:`restarts_used` is that count with its evidence; the report shows it for every torchrun run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import Field

from chaos.checks._evidence import capped, cite, events_of, host_of, verdict_of
from chaos.checks.base import CheckParams, CheckResult, register_check
from chaos.event_kinds import TARGET_AGENT_RESTART, TARGET_RESTART, TARGET_START, TARGET_WORKER
from chaos.event_kinds import TARGET_ROLE_START as ROLE_START
from chaos.history.timeline import Event, History

if TYPE_CHECKING:
    from chaos.spec.scenario import Scenario

CHECK_RESTARTS = "restarts_at_most"
EVIDENCE_KINDS = (TARGET_WORKER, TARGET_RESTART, TARGET_AGENT_RESTART, TARGET_START, ROLE_START)


def restart_number(event: Event) -> int | None:
    """The launcher restart count ``event`` shows on its host (see the module docstring), or None."""
    if event.kind == TARGET_AGENT_RESTART:
        left, budget = event.get_int("attempts_left"), event.get_int("max_restarts")
        return budget - left + 1 if left is not None and budget is not None else None
    if event.kind == TARGET_WORKER:
        return event.get_int("restart")
    if event.kind == ROLE_START:
        return event.get_int("attempt")
    if event.kind in (TARGET_RESTART, TARGET_START):
        for key in ("restart", "node_attempt", "attempt"):  # node_attempt: a multi-node rank's own count
            value = event.get_int(key)
            if value is not None:
                return value
    return None


@dataclass(frozen=True)
class RestartsUsed:
    """Restarts the launchers used: ``used`` (the highest count on any host), per host, the event that shows
    the highest count, and each restart's ``target.restart`` event where one was recorded (one per host and
    number, the launcher's own tree first)."""

    used: int
    by_host: dict[str, int]
    highest: Event
    restarts: list[Event] = field(default_factory=list)
    observations: int = 0

    def causes(self) -> list[str]:
        """One line per recorded restart: ``restart N on HOST: <cause>``."""
        lines = []
        for event in self.restarts:
            cause = event.get_str("cause")
            lines.append(f"restart {restart_number(event)} on {host_of(event)}" + (f": {cause}" if cause else ""))
        return lines


def restarts_used(history: History) -> RestartsUsed | None:
    """The restarts the job's launchers used, or None when the history shows none of the events above (the
    restarts could not be observed: not a torchrun job, or neither its tree nor its log was readable)."""
    by_host: dict[str, int] = {}
    highest: Event | None = None
    observations = 0
    restarts: dict[tuple[str, int], Event] = {}
    for kind in EVIDENCE_KINDS:
        for event in events_of(history, kind):
            number = restart_number(event)
            if number is None:
                continue
            observations += 1
            host = host_of(event) if event.kind != ROLE_START else f"{host_of(event)}/{event.get_str('replica')}"
            by_host[host] = max(by_host.get(host, 0), number)
            if highest is None or number > (restart_number(highest) or 0):
                highest = event
            if event.kind == TARGET_RESTART and number > 0:
                key = (host, number)
                # one per restart: the tree's event (it names the cause) over a rank's own report
                if key not in restarts or (event.get_str("cause") and not restarts[key].get_str("cause")):
                    restarts[key] = event
    if highest is None:
        return None
    listed = sorted(restarts.values(), key=lambda e: (e.ts_ns, host_of(e)))
    return RestartsUsed(max(by_host.values()), by_host, highest, listed, observations)


class RestartsParams(CheckParams):
    """``restarts``: the most launcher restarts the run may use (``0``: none at all)."""

    restarts: int = Field(ge=0, description="the most restarts any torchrun launcher may use")


@register_check(
    CHECK_RESTARTS,
    RestartsParams,
    to_add=(
        "launch the job with torchrun (its process tree shows the restarts) or as a roles target, or emit "
        "target.start with attempt"
    ),
)
def restarts_at_most(history: History, p: RestartsParams, scenario: Scenario | None) -> CheckResult:
    """the torchrun launcher used at most N restarts (counted from the launcher and its workers)

    ``fail`` when a launcher used more than ``restarts`` restarts (evidence: each restart with its cause,
    or the event showing the highest count); ``pass`` otherwise, citing what showed the count (0 when every
    worker seen ran in the launcher's first round); ``unknown`` when no event shows the launchers' restart
    count at all (nothing observed is no evidence of "no restart")."""
    verdict = verdict_of(CHECK_RESTARTS, bound=f"<= {p.restarts} restarts", unit=" restarts")
    found = restarts_used(history)
    if found is None:
        return verdict(
            status="unknown",
            reason="the job's restarts were not observed: no worker found in a torchrun launcher's process tree, "
            "no launcher restart line and no target.start with an attempt",
        )
    evidence = [*found.causes(), cite(history, found.highest, f"highest restart count seen: {found.used}")]
    if len(found.by_host) > 1:
        evidence.append("per host: " + ", ".join(f"{host} {count}" for host, count in sorted(found.by_host.items())))
    if found.used > p.restarts:
        return verdict(
            status="fail",
            measured=float(found.used),
            reason=f"the launcher used {found.used} restart(s), more than the {p.restarts} allowed",
            evidence=capped(evidence),
        )
    what = "no restart" if found.used == 0 else f"{found.used} restart(s)"
    return verdict(
        status="pass",
        measured=float(found.used),
        reason=f"the launcher used {what} ({found.observations} observation(s) of its restart count)",
        evidence=capped(evidence),
    )
