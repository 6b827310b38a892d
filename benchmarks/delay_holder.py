"""Latency the ``delay`` fault adds through the NFQUEUE packet holder (this kernel has no tc netem), and the
holder's ceiling: added delay p50/p99 against the requested 1, 10 and 100 ms; bulk TCP goodput and small-packet
rate through a 1 ms holder against the bare link.

Two network namespaces joined by a veth pair (``mlchaos-bench-<tag>-a``/``-b``, removed at the end); the fault
goes through the real injector (``DelayInjector`` on a ``NetnsTransport``), so the figures are what a scenario's
``delay`` gets here. Run as root: ``.venv/bin/python benchmarks/delay_holder.py [--json]``.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import shared

from chaos.cluster.netns import NetnsTransport
from chaos.plugins.injector import FaultOp, InjectionContext
from injectors.network.shape_params import DelayParams
from injectors.network.tc import DelayInjector

A, B = "10.215.0.1", "10.215.0.2"
PORT = 7781

# Both ends of a measurement, run with `python -c` inside a namespace: `serve` echoes TCP and counts UDP;
# `rtt N` prints N round trips (ms); `bulk MB` prints the TCP goodput (MB/s); `flood S` prints UDP datagrams
# the server counted in S seconds of sending 64-byte datagrams as fast as one socket can.
PROBE = r"""
import socket, sys, threading, time
mode, args = sys.argv[1], sys.argv[2:]
if mode == "serve":
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind(("0.0.0.0", __PORT__ + 1)); count = [0]
    def count_udp():
        while True:
            data, peer = udp.recvfrom(2048)
            if data == b"?": udp.sendto(str(count[0]).encode(), peer); count[0] = 0
            else: count[0] += 1
    threading.Thread(target=count_udp, daemon=True).start()
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", __PORT__)); s.listen()
    print("ready", flush=True)
    while True:
        c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        def serve(c=c):
            d = c.recv(1 << 20)
            if d.startswith(b"BULK"):
                while c.recv(1 << 20): pass
                c.sendall(b"k"); return
            while d: c.sendall(d); d = c.recv(1 << 20)
        threading.Thread(target=serve, daemon=True).start()
elif mode == "rtt":
    c = socket.create_connection((__PEER__, __PORT__)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(int(args[0])):
        t = time.perf_counter(); c.sendall(b"x" * 64); c.recv(64); print((time.perf_counter() - t) * 1e3); time.sleep(0.01)
elif mode == "bulk":
    c = socket.create_connection((__PEER__, __PORT__)); total = int(float(args[0]) * 1e6); chunk = b"\0" * (1 << 16)
    c.sendall(b"BULK"); time.sleep(0.05); t = time.perf_counter(); sent = 0
    while sent < total: c.sendall(chunk); sent += len(chunk)
    c.shutdown(socket.SHUT_WR); c.recv(1); print(sent / 1e6 / (time.perf_counter() - t))
elif mode == "flood":
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2.0); u.sendto(b"?", (__PEER__, __PORT__ + 1)); u.recvfrom(64)
    end = time.monotonic() + float(args[0]); payload = b"x" * 64
    while time.monotonic() < end: u.sendto(payload, (__PEER__, __PORT__ + 1))
    time.sleep(0.5); u.sendto(b"?", (__PEER__, __PORT__ + 1)); print(int(u.recvfrom(64)[0]) / float(args[0]))
""".replace("__PORT__", str(PORT)).replace("__PEER__", repr(B))


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


@contextmanager
def link() -> Iterator[dict[str, str]]:
    tag = uuid.uuid4().hex[:6]
    names = {"a": f"mlchaos-bench-{tag}-a", "b": f"mlchaos-bench-{tag}-b"}
    server = None
    try:
        for name in names.values():
            ip("netns", "add", name)
            ip("-n", name, "link", "set", "lo", "up")
        ip("link", "add", f"mcb{tag}a", "type", "veth", "peer", "name", f"mcb{tag}b")
        for side, addr in (("a", A), ("b", B)):
            ip("link", "set", f"mcb{tag}{side}", "netns", names[side])
            ip("-n", names[side], "addr", "add", f"{addr}/24", "dev", f"mcb{tag}{side}")
            ip("-n", names[side], "link", "set", f"mcb{tag}{side}", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", names["b"], sys.executable, "-c", PROBE, "serve"], stdout=subprocess.PIPE, text=True
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield names
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for name in names.values():
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def probe(names: dict[str, str], *args: str) -> list[float]:
    argv = ["ip", "netns", "exec", names["a"], sys.executable, "-c", PROBE, *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120)
    return [float(line) for line in done.stdout.split()]


@contextmanager
def delayed(names: dict[str, str], delay_s: float) -> Iterator[None]:
    ctx, injector = InjectionContext(NetnsTransport(names["a"])), DelayInjector()
    params = DelayParams(peers=[B], delay=delay_s)
    injector.check(ctx, params)
    op = FaultOp(op_id=f"bench-delay-{uuid.uuid4().hex[:6]}", fault="bench", injector="delay", params=params)
    applied = injector.prepare(ctx, op)
    try:
        injector.apply(ctx, applied)
        yield
    finally:
        injector.heal(ctx, applied)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> dict[str, Any]:
    cli = shared.parser(__doc__)
    cli.add_argument("--samples", type=int, default=200, help="round trips per requested delay")
    cli.add_argument("--json", action="store_true")
    args = cli.parse_args()
    figures: dict[str, Any] = {}
    with link() as names:
        base = probe(names, "rtt", str(args.samples))
        base_p50 = percentile(base, 0.5)
        figures["bare_rtt_ms"] = {"p50": round(base_p50, 3), "p99": round(percentile(base, 0.99), 3)}
        for requested_ms in (1, 10, 100):
            with delayed(names, requested_ms / 1e3):
                added = [rtt - base_p50 for rtt in probe(names, "rtt", str(args.samples))]
            p50, p99 = percentile(added, 0.5), percentile(added, 0.99)
            figures[f"added_{requested_ms}ms"] = {
                "p50": round(p50, 3),
                "p99": round(p99, 3),
                "p50_error_pct": round(100 * (p50 - requested_ms) / requested_ms, 1),
            }
            print(f"requested {requested_ms:>3} ms: added p50 {p50:7.3f} ms, p99 {p99:7.3f} ms", flush=True)
        bare_bulk, bare_rate = probe(names, "bulk", "200")[0], probe(names, "flood", "3")[0]
        with delayed(names, 0.001):
            held_bulk, held_rate = probe(names, "bulk", "200")[0], probe(names, "flood", "3")[0]
        figures["tcp_goodput_mb_s"] = {"bare": round(bare_bulk), "holder_1ms": round(held_bulk)}
        figures["udp_64b_packets_s"] = {"bare": round(bare_rate), "holder_1ms": round(held_rate)}
        print(f"TCP goodput: bare {bare_bulk:.0f} MB/s, through a 1 ms holder {held_bulk:.0f} MB/s")
        print(f"64-byte UDP datagrams delivered: bare {bare_rate:.0f}/s, through a 1 ms holder {held_rate:.0f}/s")
    return shared.json_last(figures, args.json)


if __name__ == "__main__":
    main()
