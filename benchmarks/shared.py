"""What several benchmarks share: a benchmark's command line, the median time of a call, the figures printed
as one JSON object on the last line (``--json``), and the plumbing of a fast HTTP/1.1 endpoint on asyncio. Imported as ``shared``: a benchmark runs as a script from this
folder (``python benchmarks/NAME.py``), and benchmarks/run.py puts this folder on ``sys.path``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

from chaos.kernel.procfs import read_stat

Figures = TypeVar("Figures")


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's command line, described by the first line of its docstring ``doc``."""
    return argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)


def interleaved_parser(doc: str | None, *, reps: int) -> argparse.ArgumentParser:
    """The command line of a benchmark timing interleaved blocks of steps: ``--reps`` (default ``reps``),
    ``--steps`` and ``--json``; the benchmark adds its own options."""
    cli = parser(doc)
    cli.add_argument("--reps", type=int, default=reps, help=f"interleaved repetitions (default {reps})")
    cli.add_argument("--steps", type=int, default=100, help="steps per block (default 100)")
    cli.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    return cli


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


def process_cpu_seconds(pid: int) -> float:
    """The CPU seconds (user + system) process ``pid`` has used so far (:func:`chaos.kernel.procfs.read_stat`)."""
    stat = read_stat(pid)
    if stat is None:
        raise ProcessLookupError(f"no process {pid}")
    return stat.cpu_ticks / os.sysconf("SC_CLK_TCK")


class Requests(asyncio.Protocol):
    """One connection of a keep-alive HTTP/1.1 endpoint: each complete request (its body skipped) goes to
    :meth:`answer` with the request's head (the request line and headers), in order."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end]
            at = head.lower().find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            self.answer(head)

    def answer(self, head: bytes) -> None:
        raise NotImplementedError


def serve(protocol: Callable[[], asyncio.Protocol], backlog: int) -> None:
    """Serve ``protocol`` on a free loopback port, forever; the port is the first line printed."""

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", 0, backlog=backlog)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())
