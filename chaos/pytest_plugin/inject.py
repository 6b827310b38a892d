"""``chaos_inject``: real faults as context managers, for unit tests of your own code.

Each context manager applies one REAL fault when entered and undoes it when left, in ``finally``, whatever
the test did meanwhile. They go through the runner's own fault lifecycle (:class:`chaos.run.lifecycle.FaultSession`:
journal, dead-man switch, apply; heal, disarm), so ``mlchaos cleanup`` heals what a killed pytest left, and a
fault given a ``duration`` is also reverted by its switch ``duration`` + 5 s after it was applied even if pytest
is SIGKILLed; a fault without one gets a switch at :data:`OPEN_WINDOW_S` + 5 s that a thread of this process
pushes on while the block is open, so it fires only once pytest is gone.

Tensor faults (``bitflip``, ``grad_corrupt``) change memory of this very process: nothing to journal, the
fault's own change is undone on exit (original bytes where nothing touched them since; see ArmedFault.heal).
"""

from __future__ import annotations

import random
import re
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch

    from chaos.injob.bitflip import FlipRecord
    from chaos.injob.tensor_faults import ArmedFault
    from chaos.plugins.injector import Applied, InjectionContext
    from chaos.run.lifecycle import FaultSession

HEAL_GRACE_S = 5.0  # as the scenario default safety.heal_grace: the dead-man fires this long after duration
# A duration-less fault's switch: fires this long (+ grace) after the last renewal; renewed every half of it.
OPEN_WINDOW_S = 60.0


class FaultUnsupported(Exception):
    """The fault cannot run on this machine (no root, no iptables …); the plugin turns it into a skip."""


class ChaosInject:
    """The ``chaos_inject`` fixture's value. Every method is a context manager yielding what it applied
    (an :class:`~chaos.plugins.injector.Applied`: ``description``, ``state``; for tensors the record of the bytes).

    ``run_id`` names this test's journal (``<mlchaos state dir>/journal/<run_id>.jsonl``); :meth:`close`
    (fixture teardown) archives it once everything in it is healed.
    """

    def __init__(self, run_id: str, *, unsupported: Callable[[str], NoReturn] | None = None) -> None:
        self.run_id = _safe_run_id(run_id)
        self._unsupported = unsupported  # the plugin passes pytest.skip; None raises FaultUnsupported
        self._session: FaultSession | None = None
        self._ctx: InjectionContext | None = None
        self._ops = 0

    # -- process faults ------------------------------------------------------------------------------------
    @contextmanager
    def kill(self, pid: int | None = None, *, name: str | None = None, signal: str = "SIGKILL") -> Iterator[Applied]:
        """Send ``signal`` to process ``pid`` (or every process whose command line matches regex ``name``).
        Irreversible: leaving the block undoes nothing. Never targets pytest itself or its ancestors."""
        with self.fault("kill", _selector(pid, name, signal=signal)) as applied:
            yield applied

    @contextmanager
    def freeze(self, pid: int | None = None, *, name: str | None = None, duration: float = 60.0) -> Iterator[Applied]:
        """SIGSTOP the selected processes until the block ends (SIGCONT), at most ``duration`` seconds
        (the dead-man sends SIGCONT ``duration`` + 5 s after apply if this process cannot)."""
        with self.fault("freeze", _selector(pid, name), duration=duration) as applied:
            yield applied

    @contextmanager
    def slow(
        self,
        pid: int | None = None,
        *,
        name: str | None = None,
        stopped_fraction: float = 0.5,
        period: float = 1.0,
        duration: float = 60.0,
    ) -> Iterator[Applied]:
        """Stop the selected processes ``stopped_fraction`` of every ``period`` seconds (a detached
        SIGSTOP/SIGCONT duty-cycle helper) until the block ends, at most ``duration`` seconds."""
        params = _selector(pid, name, stopped_fraction=stopped_fraction, period=period)
        with self.fault("slow", params, duration=duration) as applied:
            yield applied

    # -- network faults ------------------------------------------------------------------------------------
    @contextmanager
    def partition(
        self,
        peers: Sequence[str],
        *,
        ports: Sequence[int] = (),
        direction: str = "both",
        protocol: str = "all",
        duration: float = 300.0,
    ) -> Iterator[Applied]:
        """Drop traffic between this machine and ``peers`` (IPv4 addresses/CIDRs; ``127.0.0.1`` works), only
        on ``ports`` when given, with iptables rules in mlchaos's own tagged chains, until the block ends
        (at most ``duration`` seconds: the dead-man removes the chains after that). Needs root or sudo."""
        params = {"peers": list(peers), "ports": list(ports), "direction": direction, "protocol": protocol}
        with self.fault("partition", params, duration=duration) as applied:
            yield applied

    # -- any harness-side injector ---------------------------------------------------------------------------
    @contextmanager
    def fault(self, kind: str, params: Mapping[str, object], *, duration: float | None = None) -> Iterator[Applied]:
        """Apply any registered harness-side injector (``packet_loss``, ``delay``, ``storage``, ``cpu_throttle``
        …) with its YAML ``params`` on this machine, until the block ends (at most ``duration`` seconds when
        given; faults that need a duration refuse to start without one).

        Raises :class:`FaultUnsupported` (the ``chaos_inject`` fixture skips the test instead) when the injector's capability probe refuses,
        ``pydantic.ValidationError`` for bad params, ``InjectionError`` when applying fails (after healing
        whatever part was applied).
        """
        from chaos.plugins import registry
        from chaos.plugins.injector import FaultOp, Unsupported, is_in_job

        if kind not in registry.injectors():
            raise ValueError(f"no injector named {kind!r}; known: {', '.join(registry.injectors())}")
        injector = registry.injector(kind)
        if is_in_job(injector):
            raise ValueError(f"{kind} is applied inside a training job; in a unit test use chaos_inject.bitflip")
        model = injector.Params.model_validate(dict(params))
        ctx = self._context()
        try:
            injector.check(ctx, model)
        except Unsupported as exc:
            reason = f"{kind} is not supported here: {exc}"
            if self._unsupported is not None:
                self._unsupported(reason)
            raise FaultUnsupported(reason) from None
        self._ops += 1
        op_id = f"{kind}-{self._ops}"
        session = self._fault_session()
        # The runner's lifecycle: journaled, switch armed, applied (healed at once if that fails, then raised).
        op = FaultOp(op_id=op_id, fault=op_id, injector=kind, params=model, duration_s=duration)
        active = session.fire(injector, op)
        if duration is None and active.switch is not None:
            session.keep_renewed()  # its switch fires only once this process stops renewing it (killed, hung)
        try:
            yield active.applied
        finally:
            session.heal(active)  # raises: the journal keeps it unhealed and the dead-man armed

    # -- tensor faults -------------------------------------------------------------------------------------
    @contextmanager
    def bitflip(
        self,
        model: torch.nn.Module,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        seed: int = 0,
        step: int = 0,
        **params: Any,
    ) -> Iterator[ArmedFault]:
        """Corrupt a tensor of ``model`` as the scenario ``bitflip`` fault does (``params`` are its YAML params:
        ``where``, ``layer``, ``kind``, ``element``, ``bit``, ``count``, ``block``, ``factor`` …), once on entry
        (``where: activations``: in the next forward); only the fault's change is undone on exit.

        Yields the armed fault: ``.records`` lists what changed (indices, original bytes), ``.target`` the
        tensor's name, ``.describe()`` a summary. Stuck/intermittent faults re-fire when you call
        ``.fire(step)`` at each step. Draws are seeded by ``seed``, so a test corrupts the same bits every time.
        """
        from chaos.injob.tensor_faults import arm
        from injectors.tensor import BitFlipParams

        armed = arm(model, optimizer, BitFlipParams.model_validate(params), random.Random(seed))
        try:
            armed.fire(step)
            yield armed
        finally:
            armed.heal()

    @contextmanager
    def grad_corrupt(self, tensor: torch.Tensor, *, seed: int = 0, **params: Any) -> Iterator[FlipRecord]:
        """Corrupt ``tensor`` (a gradient or any float tensor) in place with the ``grad_corrupt`` fault's
        corruption (``kind``, ``element``, ``bit``, ``count``, ``magnitude``, ``block``, ``factor``); the exact
        original bytes are restored on exit. Yields the record of what changed. ``site``/``bucket``/``rank``
        belong to the collective and mean nothing here."""
        from chaos.injob.bitflip import restore
        from chaos.injob.fault_specs import GradCorruptSpec
        from chaos.injob.grad_faults import corrupt_bucket
        from injectors.gradient import GradCorruptParams

        flat = tensor.detach().view(-1)  # a flat view of the same storage: records index it row-major
        spec = GradCorruptSpec.from_params(GradCorruptParams.model_validate(params).model_dump())
        record = corrupt_bucket(flat, spec, random.Random(seed))
        try:
            yield record
        finally:
            restore(flat, record)

    # -- lifecycle -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop renewing and archive this test's journal when nothing in it is left to heal (else leave it for
        ``mlchaos cleanup``)."""
        if self._session is not None:
            self._session.close()
            self._session.journal.archive()
            self._session = None

    def _context(self) -> InjectionContext:
        if self._ctx is None:
            from chaos.cluster.local import LocalTransport
            from chaos.plugins.injector import InjectionContext

            self._ctx = InjectionContext(LocalTransport())
        return self._ctx

    def _fault_session(self) -> FaultSession:
        if self._session is None:
            from chaos.run.lifecycle import FaultSession
            from chaos.safety.journal import Journal
            from chaos.spec.scenario import SafetySpec

            safety = SafetySpec(max_duration=OPEN_WINDOW_S, heal_grace=HEAL_GRACE_S)
            self._session = FaultSession(Journal.for_run(self.run_id), safety, lambda host: self._context())
        return self._session


def _selector(pid: int | None, name: str | None, **extra: object) -> dict[str, object]:
    chosen = {key: value for key, value in (("pid", pid), ("name", name)) if value is not None}
    if len(chosen) != 1:
        raise ValueError("give exactly one of pid or name")
    return {**chosen, **extra}


def _safe_run_id(text: str) -> str:
    """A journal-safe run id from a test name, made unique so parallel tests never share a journal."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:60] or "test"
    return f"pytest-{slug}-{secrets.token_hex(3)}"
