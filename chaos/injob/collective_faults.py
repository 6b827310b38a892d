"""The ``collective_fault`` fault: rank R's own agent fails its ``index``-th collective of step ``at_step``, and the
process lives on; what follows is the job's own handling.

The point is a collective call the rank makes through ``torch.distributed`` (``all_reduce``, ``barrier``, ...),
counted per step as the collective flight recorder counts them (:mod:`chaos.injob.flight_recorder`, whose
wrappers the agent installs for this fault; a DDP job's gradient all-reduce is one of them through the agent's
comm hook). Per ``kind``:

- ``error``: that one call raises ``torch.distributed.DistBackendError`` (torch's type for a backend's failed
  collective; a ``RuntimeError``, so a handler of gloo's plain ``RuntimeError`` catches it too) and does not
  run: emulated at the narrowest point, the call itself. The rest is real: the process group is untouched, the
  peers wait in their matching collective; a retry of the call pairs with them and completes, a rank that moves
  on pairs its next collective with the wrong one or waits in another group's (a hang, until the process-group
  timeout).
- ``abort``: just before that call runs, every process group of the rank is aborted (:mod:`chaos.injob.pg_abort`:
  ``ProcessGroup.abort()``, and for gloo its connections shut down), then the call runs and fails with the
  backend's own error, as do the peers' collectives.

Firing: mark the op fired (the cross-restart marker: a restarted rank recomputing the step does not fail
again), report ``fault.applied`` {step, index, collective, collective_kind, pid; an abort's groups and connections}
and fsync the event file, then fail. Each op fires at most once per run.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import get_args

import torch.distributed as dist

from chaos.injob.crash_faults import settle
from chaos.injob.fault_events import FaultEvents, FiringRules
from chaos.injob.fault_specs import CollectiveFaultSpec, CollectiveKind
from chaos.injob.flight_recorder import Recorder
from chaos.injob.pg_abort import prepare_abort
from chaos.plan.agent_plan import InJobOp, JsonValue

COLLECTIVE_FAULT = "collective_fault"
COLLECTIVE_KINDS: tuple[str, ...] = get_args(CollectiveKind)


class CollectiveFaults:
    """The plan's ``collective_fault`` ops; this rank's (``mine``), not fired yet in this run, fire at their
    (step, index) through the recorder they are armed on (:meth:`arm`).

    ``rules`` are the agent's (:class:`chaos.injob.fault_events.FiringRules`). Raises ValueError for an op that
    would never fire as asked: an unknown kind or a negative index.
    """

    def __init__(self, ops: Sequence[InJobOp], rules: FiringRules) -> None:
        self._rules = rules
        planned = [(op, CollectiveFaultSpec.from_params(op.params)) for op in ops if op.injector == COLLECTIVE_FAULT]
        for op, spec in planned:
            if spec.kind not in COLLECTIVE_KINDS:
                raise ValueError(
                    f"fault {op.fault!r}: collective_fault kind {spec.kind!r} is not one of {', '.join(COLLECTIVE_KINDS)}"
                )
            if spec.index < 0:
                raise ValueError(f"fault {op.fault!r}: index {spec.index} is below 0 (0: the step's first collective)")
        self._ops = [(op, spec) for op, spec in planned if rules.mine(op) and not rules.already_fired(op)]
        self._events = FaultEvents(rules.emit, rules.rank)

    @property
    def wanted(self) -> bool:
        """Whether this rank has an op to fire (it then needs the recorder's collective wrappers)."""
        return bool(self._ops)

    def arm(self, recorder: Recorder) -> None:
        """Hand this rank's ops to ``recorder``, which runs each when its (step, index) collective starts."""
        for op, spec in self._ops:
            recorder.intercept(op.at_step, spec.index, functools.partial(self.fire, op, spec))

    def fire(self, op: InJobOp, spec: CollectiveFaultSpec, collective: str) -> None:
        """Fail the collective ``collective`` that is starting (module docstring): raises DistBackendError
        (``error``), or aborts the groups and returns so that the call runs and fails (``abort``)."""
        if self._rules.already_fired(op):
            return  # fired by an earlier attempt of this run
        self._rules.mark_fired(op)
        step, rank, pid = self._rules.step(), self._rules.rank, os.getpid()
        at = f"collective {spec.index} of step {step} ({collective})"
        where: dict[str, JsonValue] = {
            "index": spec.index,
            "collective": collective,
            "collective_kind": spec.kind,
            "pid": pid,
        }
        if spec.kind == "error":
            description = f"{collective} of rank {rank} (pid {pid}) fails by its own agent: {at}, not run"
            self._events.applied(op, step, description, **where)
            settle()
            raise dist.DistBackendError(
                f"collective_fault {op.fault!r} (op {op.op_id}): {collective} failed on rank {rank}, {at}; the "
                "collective did not run and its peers wait in it (injected by mlchaos)"
            )
        # abort: found first, so that fault.applied says what it aborts before anything is
        abort = prepare_abort()
        description = (
            f"{len(abort.groups)} process group(s) of rank {rank} (pid {pid}; {', '.join(abort.backends) or 'none'})"
            f" aborted by its own agent before {at}, {len(abort.fds)} connection(s) shut down"
        )
        self._events.applied(op, step, description, **where, groups=len(abort.groups), connections=len(abort.fds))
        settle()
        abort.run()


__all__ = ["COLLECTIVE_FAULT", "COLLECTIVE_KINDS", "CollectiveFaults"]
