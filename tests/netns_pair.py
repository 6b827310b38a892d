"""Two network namespaces joined by a veth pair (10.78.0.1 sender, 10.78.0.2 receiver), for the network faults'
tests that need real packets between two hosts and nothing else; deleted in the fixture's ``finally``."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

RECEIVE = r"""
import collections, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 9100)); s.settimeout(1.0)
print("ready", flush=True)
seen = collections.Counter()
try:
    while True:
        seen[s.recvfrom(100)[0]] += 1
except socket.timeout:
    pass
print(sum(seen.values()), len(seen), flush=True)
"""
SEND = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(str(i).encode(), (sys.argv[1], 9100)); time.sleep(0.0002)
"""

ECHO = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 9101))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(100); s.sendto(data, peer)
"""
PING = r"""
import socket, statistics, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
rtts = []
for i in range(int(sys.argv[2])):
    began = time.monotonic(); s.sendto(b"x", (sys.argv[1], 9101)); s.recvfrom(100)
    rtts.append((time.monotonic() - began) * 1e3)
print(statistics.median(rtts))
"""


@dataclass
class Pair:
    sender: str
    receiver: str
    receiver_address: str = "10.78.0.2"

    def count(self, datagrams: int) -> tuple[int, int]:
        """(datagrams received, distinct datagrams) of ``datagrams`` sent from sender to receiver."""
        listen = subprocess.Popen(
            ["ip", "netns", "exec", self.receiver, sys.executable, "-c", RECEIVE, self.receiver_address],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert listen.stdout is not None and listen.stdout.readline().strip() == "ready"
        subprocess.run(
            ["ip", "netns", "exec", self.sender, sys.executable, "-c", SEND, self.receiver_address, str(datagrams)],
            check=True,
        )
        received, distinct = (int(word) for word in listen.communicate(timeout=30)[0].split())
        return received, distinct

    def rtt_ms(self, samples: int = 20) -> float:
        """The median round trip in ms of UDP echoes from sender to receiver."""
        server = subprocess.Popen(
            ["ip", "netns", "exec", self.receiver, sys.executable, "-c", ECHO, self.receiver_address],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            done = subprocess.run(
                ["ip", "netns", "exec", self.sender, sys.executable, "-c", PING, self.receiver_address, str(samples)],
                check=True,
                capture_output=True,
                text=True,
            )
            return float(done.stdout.strip())
        finally:
            server.kill()
            server.wait()


@contextmanager
def veth_pair() -> Iterator[Pair]:
    tag = uuid.uuid4().hex[:6]
    sender, receiver, veth = f"chaos-dup-{tag}-a", f"chaos-dup-{tag}-b", f"cdup{tag}"
    setup = [
        ["ip", "netns", "add", sender],
        ["ip", "netns", "add", receiver],
        [
            "ip",
            "link",
            "add",
            f"{veth}a",
            "netns",
            sender,
            "type",
            "veth",
            "peer",
            "name",
            f"{veth}b",
            "netns",
            receiver,
        ],
        ["ip", "-n", sender, "addr", "add", "10.78.0.1/24", "dev", f"{veth}a"],
        ["ip", "-n", receiver, "addr", "add", "10.78.0.2/24", "dev", f"{veth}b"],
        ["ip", "-n", sender, "link", "set", f"{veth}a", "up"],
        ["ip", "-n", receiver, "link", "set", f"{veth}b", "up"],
    ]
    try:
        for argv in setup:
            subprocess.run(argv, check=True)
        yield Pair(sender, receiver)
    finally:
        for name in (sender, receiver):
            subprocess.run(["ip", "netns", "del", name], check=False)
