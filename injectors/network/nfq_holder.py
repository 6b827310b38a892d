"""The packet holder behind ``delay`` and ``jitter`` where the kernel has no tc netem: a detached helper that
binds one NFQUEUE queue and gives each packet the kernel queues to it an ACCEPT verdict after its delay.

Run as ``python -m injectors.network.nfq_holder --op-id ID --queue N --delay-us D [--jitter-us J
--distribution uniform|normal --correlation PCT --seed S --reorder-pct P] --until-ns T [--max-held M] [--log FILE]``; it
detaches (:func:`chaos.safety.deadman.detach`) unless ``--foreground``. Standard library only besides that. It speaks nfnetlink_queue over a
netlink socket: metadata only (no payload copied), GSO packets queued whole, and fail-open (a full kernel
queue lets packets through rather than dropping them). Rules steer packets here with ``--queue-bypass``, so
traffic flows undelayed whenever no holder is bound. On SIGTERM or at ``--until-ns`` (the host's clock) it
releases every held packet at once, unbinds and exits 0. Packets it holds when SIGKILLed are dropped by the
kernel when its socket closes (TCP resends them).
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import TextIO

from chaos.safety.deadman import detach

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_GSO = 1, 4
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
KERNEL_QUEUE_MAXLEN = 65536  # packets the kernel keeps for us before failing open
RCVBUF = 32 * 1024 * 1024


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(msg: int, queue: int, attrs: bytes, *, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    """One nfnetlink message: nlmsghdr, nfgenmsg (AF_UNSPEC, version 0, the queue number big-endian), attrs."""
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def _attrs(data: bytes, offset: int) -> dict[int, bytes]:
    found = {}
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        found[kind & 0x7FFF] = data[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return found


class Queue:
    """One bound nfnetlink_queue queue: packets in (their ids), verdicts out."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root): no dropped messages
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self.sock.bind((0, 0))
        self._seq = 0
        self._config(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET)))
        self._config(
            _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
            + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", KERNEL_QUEUE_MAXLEN))
            + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO))
            + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO))
        )
        self.sock.setblocking(False)

    def _config(self, attrs: bytes) -> None:
        """Send one config message and wait for its ack; OSError with the kernel's errno when refused."""
        self._seq += 1
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.number, attrs, seq=self._seq, flags=NLM_F_REQUEST | NLM_F_ACK))
        while True:
            data = self.sock.recv(65536)
            length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, 0)
            if kind == NLMSG_ERROR and seq == self._seq:
                (error,) = struct.unpack_from("=i", data, 16)
                if error:
                    raise OSError(-error, f"nfnetlink_queue refused queue {self.number}: {os.strerror(-error)}")
                return

    def packets(self) -> list[int]:
        """The ids of the packets waiting on the socket now (none when it would block)."""
        ids: list[int] = []
        while True:
            try:
                data = self.sock.recv(RCVBUF // 8)
            except BlockingIOError:
                return ids
            offset = 0
            while offset + 16 <= len(data):
                length, kind, _, _, _ = struct.unpack_from("=IHHII", data, offset)
                if length < 16:
                    break
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    header = _attrs(data[offset : offset + length], 20).get(NFQA_PACKET_HDR)
                    if header is not None:
                        ids.append(struct.unpack_from("!I", header, 0)[0])
                offset += (length + 3) & ~3

    def accept(self, packet_id: int) -> None:
        verdict = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
        message = _message(NFQNL_MSG_VERDICT, self.number, verdict, seq=0)
        while True:
            try:
                self.sock.send(message)
                return
            except BlockingIOError:
                select.select([], [self.sock], [], 0.01)

    def close(self) -> None:
        try:
            self.sock.setblocking(True)
            self._config(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, socket.AF_INET)))
        except OSError:
            pass  # closing the socket unbinds too
        self.sock.close()


class Delays:
    """Each packet's hold time in seconds: ``delay`` plus a ``jitter`` drawn uniform (±jitter) or normal (sd
    jitter), each draw ``correlation`` percent the last one's; never below zero. ``reorder`` percent of packets
    are not held at all, so they overtake the held ones (netem's ``reorder``)."""

    def __init__(
        self, delay_s: float, jitter_s: float, distribution: str, correlation: float, seed: int, reorder: float = 0.0
    ) -> None:
        self.delay_s, self.jitter_s, self.distribution = delay_s, jitter_s, distribution
        self.keep = correlation / 100.0
        self.reorder = reorder / 100.0
        self.rng = random.Random(seed)
        self.last = 0.0

    def next(self) -> float:
        if self.reorder > 0 and self.rng.random() < self.reorder:
            return 0.0
        if self.jitter_s <= 0:
            return self.delay_s
        if self.distribution == "normal":
            draw = self.rng.gauss(0.0, self.jitter_s)
        else:
            draw = self.rng.uniform(-self.jitter_s, self.jitter_s)
        self.last = self.keep * self.last + (1.0 - self.keep) * draw
        return max(0.0, self.delay_s + self.last)


def hold(queue: Queue, delays: Delays, until_ns: int, max_held: int, stopping: list[bool], log: TextIO) -> None:
    """Hold each packet for its delay, then accept it; at ``until_ns`` or once ``stopping`` is set, accept every
    held packet at once. Past ``max_held`` held packets, new ones are accepted at once (fail-open, counted)."""
    held: list[tuple[float, int]] = []
    passed_over = 0
    while not stopping[0] and time.time_ns() < until_ns:
        now = time.monotonic()
        while held and held[0][0] <= now:
            queue.accept(heapq.heappop(held)[1])
        timeout = min(held[0][0] - now if held else 0.2, 0.2, max(0.0, (until_ns - time.time_ns()) / 1e9))
        try:
            readable, _, _ = select.select([queue.sock], [], [], max(0.0, timeout))
        except InterruptedError:
            continue
        if readable:
            arrived = time.monotonic()
            for packet_id in queue.packets():
                if len(held) >= max_held:
                    queue.accept(packet_id)
                    passed_over += 1
                    continue
                heapq.heappush(held, (arrived + delays.next(), packet_id))
    for _, packet_id in sorted(held):
        queue.accept(packet_id)
    print(f"released {len(held)} held packet(s); {passed_over} passed undelayed (holder full)", file=log, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nfq_holder", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--op-id", required=True)
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--delay-us", type=int, required=True)
    parser.add_argument("--jitter-us", type=int, default=0)
    parser.add_argument("--distribution", choices=("uniform", "normal"), default="uniform")
    parser.add_argument("--correlation", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reorder-pct", type=float, default=0.0)
    parser.add_argument("--until-ns", type=int, required=True)
    parser.add_argument("--max-held", type=int, default=100_000)
    parser.add_argument("--log")
    parser.add_argument("--foreground", action="store_true", help="do not detach (debugging, benchmarks)")
    args = parser.parse_args(argv)
    if not args.foreground:
        detach(Path(args.log) if args.log else None)  # stdout/stderr now go to the log
    log = sys.stderr
    stopping = [False]

    def stop(signum: int, frame: object) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        queue = Queue(args.queue)
    except OSError as exc:
        print(f"nfq_holder {args.op_id}: cannot bind queue {args.queue}: {exc}", file=log, flush=True)
        return 3
    delays = Delays(
        args.delay_us / 1e6, args.jitter_us / 1e6, args.distribution, args.correlation, args.seed, args.reorder_pct
    )
    print(f"nfq_holder {args.op_id}: holding queue {args.queue}", file=log, flush=True)
    try:
        hold(queue, delays, args.until_ns, args.max_held, stopping, log)
    finally:
        queue.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
