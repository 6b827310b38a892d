"""What injector classes share beyond the plugin contract: a held fault's duration, a one-shot fault's flags and the
capability probe a ``check`` runs on the fault's host.

A held fault (a freeze, a quota, a mount, a hog) keeps something in place until its deadline or heal: it derives
from :class:`HeldFault`, which declares ``needs_duration`` (the preflight refuses it without a ``duration``) and
reads that duration in ``prepare``. A one-shot fault (a signal, a restart) happens once and has nothing to hold:
:class:`OneShot` declares it so (a ``duration`` on it is refused).
"""

from __future__ import annotations

from typing import ClassVar

from chaos.cluster.base import Transport, TransportError
from chaos.plugins.injector import Applied, FaultOp, InjectionContext, InjectionError, InjectorBase, Unsupported


class HeldFault(InjectorBase):
    """A fault held until its deadline or heal: it must be given a ``duration``, so that it always ends."""

    needs_duration: ClassVar[bool] = True

    def duration(self, op: FaultOp) -> float:
        """``op``'s duration in seconds; InjectionError when it has none."""
        if op.duration_s is None or op.duration_s <= 0:
            raise InjectionError(f"{self.name} needs a duration (e.g. `duration: 20s`) so that it always ends")
        return op.duration_s


class OneShot(InjectorBase):
    """A fault that happens once (a signal, a restart): nothing to hold, so a ``duration`` means nothing to it, and
    nothing to heal or revert. Listed first among the bases, so that it overrides a held base's."""

    one_shot: ClassVar[bool] = True
    needs_duration: ClassVar[bool] = False

    def heal(self, ctx: InjectionContext, applied: Applied) -> None:
        """Nothing to undo: what happened once cannot be taken back (the target's own recovery is under test)."""

    def revert_command(self, applied: Applied) -> list[str] | None:
        return None


def probe(
    transport: Transport, argv: list[str], cannot: str, fails: str, *, timeout: float = 30, stderr: bool = False
) -> None:
    """Run the capability probe ``argv`` on the fault's host. Unsupported ``<cannot> <host>: <why>`` when it cannot be
    run there; when it exits non-zero, Unsupported ``fails`` with ``{host}`` filled in (followed by ``: <its
    stderr>`` when ``stderr``)."""
    try:
        done = transport.run(argv, timeout=timeout)
    except TransportError as exc:
        raise Unsupported(f"{cannot} {transport.host}: {exc}") from exc
    if not done.ok:
        why = fails.format(host=transport.host)
        raise Unsupported(f"{why}: {done.stderr.strip()[:200]}" if stderr else why)
