"""What several benchmarks share: a benchmark's command line, the median time of a call, and the figures printed
as one JSON object on the last line (``--json``). Imported as ``shared``: a benchmark runs as a script from this
folder (``python benchmarks/NAME.py``), and benchmarks/run.py puts this folder on ``sys.path``."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

Figures = TypeVar("Figures")


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's command line, described by the first line of its docstring ``doc``."""
    return argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)


def median_seconds(fn: Callable[[], Any], reps: int, *, warm_up: bool = True) -> float:
    """The median wall time of ``reps`` calls of ``fn``, after one untimed call (unless not ``warm_up``)."""
    if warm_up:
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def json_last(figures: Figures, wanted: bool, *, sort_keys: bool = True) -> Figures:
    """``figures``, printed as one JSON object on the last line of the output when ``wanted`` (``--json``)."""
    if wanted:
        print(json.dumps(figures, sort_keys=sort_keys))
    return figures
