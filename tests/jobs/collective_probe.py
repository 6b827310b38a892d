"""Run a training script with every ``torch.distributed.all_reduce`` observed, independently of the agent.

``torchrun ... tests/jobs/collective_probe.py JOB.py [JOB ARGS]`` runs ``JOB.py`` as ``__main__`` after wrapping
``torch.distributed.all_reduce``: each call emits ``probe.collective`` {n, state: "enter"} before it starts and
{n, state: "done"} when it returned (synchronous) or its work's ``wait()`` returned (``async_op=True``). ``n``
counts this process's all-reduces; data-parallel ranks run the same collectives in the same order, so equal
``n`` on two ranks is the same collective. A rank killed inside a collective leaves an ``enter`` with no ``done``
as its last probe event; a peer blocked in that collective when it died leaves the same ``n`` unfinished.

The probe is test instrumentation (the benchmark ``benchmarks/phase_kill.py`` and
``tests/integration/test_phase_kill.py`` use it), not part of the job: the job itself stays a user's script.
"""

from __future__ import annotations

import itertools
import runpy
import sys
from typing import Any

import torch.distributed as dist

from chaos.events import emit

_real_all_reduce = dist.all_reduce
_count = itertools.count()


class _ObservedWork:
    """An async all-reduce's work whose ``wait()`` reports ``done``; every other attribute is the work's own."""

    def __init__(self, work: Any, n: int) -> None:
        self._work = work
        self._n = n

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        emit("probe.collective", n=self._n, state="done")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _observed_all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    n = next(_count)
    emit("probe.collective", n=n, state="enter", numel=int(tensor.numel()))
    work = _real_all_reduce(tensor, *args, **kwargs)
    if work is None:  # synchronous: it has completed
        emit("probe.collective", n=n, state="done")
        return None
    return _ObservedWork(work, n)


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: collective_probe.py JOB.py [JOB ARGS]")
    dist.all_reduce = _observed_all_reduce  # type: ignore[assignment]  # looked up at each call by the job and agent
    job = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(job, run_name="__main__")


if __name__ == "__main__":
    main()
