"""The "restarts used" row of a torchrun run's verdict table (CLI, report.html) and its ``run.json`` entry.

Every torchrun run shows the restarts its launchers used (:func:`chaos.checks.restarts.restarts_used`), whether
or not the scenario asks ``restarts_at_most``: a run that needed three restarts must not read like a clean
one. A ``roles`` run shows the restarts its restart policies made (``target.role_restart``), per replica, each
with the exit it answered. Other targets show the row only when the history holds a launcher's evidence
(``target.worker``, ``target.agent_restart``). The row judges nothing: its result column says ``info`` and the
run's verdict does not depend on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import JsonValue

from chaos.checks.restarts import restarts_used
from chaos.event_kinds import TARGET_AGENT_RESTART, TARGET_WORKER
from chaos.event_kinds import TARGET_ROLE_EXIT as ROLE_EXIT
from chaos.event_kinds import TARGET_ROLE_RESTART as ROLE_RESTART
from chaos.history.timeline import History

if TYPE_CHECKING:
    from chaos.run.result import RunResult

ROW_NAME = "restarts used"
ROW_STATUS = "info"


@dataclass(frozen=True)
class RestartsRow:
    """The row's cells: ``measured`` (a count, or ``?`` when not observed), ``bound`` (the budget) and ``why``."""

    measured: str
    bound: str
    why: str
    used: int | None
    by_host: Mapping[str, int]
    causes: tuple[str, ...]
    by_replica: Mapping[str, int] = field(default_factory=dict)  # a roles run: restarts per replica

    def cells(self) -> tuple[str, str, str, str, str]:
        """(check, result, measured, bound, why), the columns of the CLI verdict table."""
        return ROW_NAME, ROW_STATUS, self.measured, self.bound, self.why

    def to_json(self) -> dict[str, JsonValue]:
        """The ``restarts`` entry of run.json."""
        out: dict[str, JsonValue] = {"used": self.used, "by_host": dict(self.by_host), "causes": list(self.causes)}
        out["budget"] = self.bound
        if self.by_replica:
            out["by_replica"] = dict(self.by_replica)
        return out


def restarts_row(history: History, target_type: str | None, max_restarts: int | None) -> RestartsRow | None:
    """The row for a run of a ``target_type`` target with ``--max-restarts`` ``max_restarts``; None when the run
    is not a torchrun run (see the module docstring)."""
    if target_type == "roles":
        return _role_restarts(history)
    found = restarts_used(history)
    launcher_seen = bool(history.of(TARGET_WORKER) or history.of(TARGET_AGENT_RESTART))
    if target_type != "torchrun" and not launcher_seen:
        return None
    bound = f"max_restarts {max_restarts}" if max_restarts is not None else "-"
    if found is None:
        why = "not observed: no worker was found in the launcher's process tree and it logged no restart"
        return RestartsRow("?", bound, why, None, {}, ())
    causes = tuple(found.causes())
    why = "; ".join(causes) if causes else ("no restart" if found.used == 0 else "cause not recorded")
    return RestartsRow(str(found.used), bound, why, found.used, dict(found.by_host), causes)


def _role_restarts(history: History) -> RestartsRow:
    """The row of a ``roles`` run: every restart its policies made, per replica, with the exit each answered."""
    restarts = history.of(ROLE_RESTART)
    exits = history.of(ROLE_EXIT)
    by_replica = Counter(event.get_str("replica") or "?" for event in restarts)
    causes: list[str] = []
    for event in restarts:
        replica = event.get_str("replica")
        before = [e for e in exits if e.get_str("replica") == replica and e.ts_ns <= event.ts_ns]
        code = before[-1].get_int("code") if before else None
        answered = f"exit {code}" if code is not None and code >= 0 else f"signal {-code}" if code else "an exit"
        causes.append(f"{replica} after {answered}")
    counted = ", ".join(f"{name} x{count}" for name, count in sorted(by_replica.items()))
    why = f"{counted}: {'; '.join(causes)}" if causes else "no restart"
    return RestartsRow(str(len(restarts)), "restart policies", why, len(restarts), {}, tuple(causes), dict(by_replica))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def restarts_row_of(result: RunResult) -> RestartsRow | None:
    """:func:`restarts_row` of a finished run."""
    target = result.scenario.target
    return restarts_row(result.history, getattr(target, "type", None), _int(getattr(target, "max_restarts", None)))


def restarts_row_of_document(document: Mapping[str, object], history: History) -> RestartsRow | None:
    """:func:`restarts_row` of a run.json document (its ``scenario.target``) whose events are ``history``."""
    scenario = document.get("scenario")
    target = scenario.get("target") if isinstance(scenario, Mapping) else None
    if not isinstance(target, Mapping):
        return restarts_row(history, None, None)
    kind = target.get("type")
    return restarts_row(history, kind if isinstance(kind, str) else None, _int(target.get("max_restarts")))
