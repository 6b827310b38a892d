"""The host-side helper of the ``flap`` fault: a partition that goes down and up on a period, then heals.

``python -m injectors.network.flap_helper --op-id ID --chains CHAOS-..-in,CHAOS-..-out --period 2 --down-fraction 0.5
--until-ns N [--log PATH] [--foreground]`` detaches (see :func:`chaos.safety.deadman.detach`) and then, each period,
removes the RETURN bypass at the top of the op's chains (partition in force) for ``down-fraction`` of it and
puts it back for the rest, until the wall-clock deadline ``until-ns`` or SIGTERM/SIGINT. However it ends
(short of SIGKILL) it removes the op's chains and every jump to them (:func:`injectors.network.iptables.remove`),
so the host is left healed; the harness's heal then finds nothing left to do.

It runs ON the host (started through the transport), so its iptables calls are plain local commands in the
host's (or namespace's) own network stack.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from chaos.cluster.base import Completed
from chaos.cluster.local import LocalTransport
from chaos.plugins.injector import InjectionError
from chaos.safety.deadman import detach
from injectors.network import iptables as netfilter

MODULE = "injectors.network.flap_helper"
_SLICE_S = 0.05  # sleeps are sliced so a SIGTERM ends the cycle promptly


class _Flap:
    def __init__(self) -> None:
        self.stop_requested = False

    def request_stop(self, signum: int, frame: object) -> None:
        # A flag, not an exception: an exception could fire inside the final removal and skip it.
        self.stop_requested = True

    def sleep_until(self, deadline: float) -> None:
        while not self.stop_requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, _SLICE_S))


def _local(argv: list[str]) -> Completed:
    return LocalTransport().run(argv, timeout=30)


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} netflap[{os.getpid()}] {message}", flush=True)


def run(chains: list[str], period_s: float, down_fraction: float, until_ns: int) -> int:
    """Flap ``chains`` until ``until_ns``; always removes them at the end. 0 when the host was left clean."""
    flap = _Flap()
    signal.signal(signal.SIGTERM, flap.request_stop)
    signal.signal(signal.SIGINT, flap.request_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        while not flap.stop_requested:
            left_s = (until_ns - time.time_ns()) / 1e9
            if left_s <= 0:
                break
            start = time.monotonic()
            try:
                netfilter.set_bypass(_local, chains, up=False)
                flap.sleep_until(start + min(period_s * down_fraction, left_s))
                netfilter.set_bypass(_local, chains, up=True)
            except InjectionError as exc:  # keep cycling: the final removal below still heals
                _log(f"toggle failed: {exc}")
            flap.sleep_until(start + min(period_s, left_s))
    finally:
        # Block SIGTERM: a heal arriving now must not cut the removal short (it waits for us to exit).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            netfilter.remove(_local, chains)
        except InjectionError as exc:
            _log(f"could not remove {chains}: {exc}")
            return 1
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--op-id", required=True, help="the fault op this helper belongs to (heal finds it by it)")
    parser.add_argument("--chains", required=True, help="comma-separated CHAOS-<hex>-in|out chains of the op")
    parser.add_argument("--period", type=float, required=True, help="seconds per down+up cycle")
    parser.add_argument("--down-fraction", type=float, required=True, help="share of each period partitioned")
    parser.add_argument("--until-ns", type=int, required=True, help="wall-clock deadline (time.time_ns)")
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--foreground", action="store_true", help="do not detach (debugging)")
    args = parser.parse_args(argv)
    try:
        chains = [netfilter.checked_chain(name) for name in args.chains.split(",") if name]
    except InjectionError as exc:
        parser.error(str(exc))
    if not chains or not 0 < args.down_fraction < 1 or args.period <= 0:
        parser.error("need at least one chain, 0 < --down-fraction < 1 and --period > 0")
    if not args.foreground:
        detach(args.log)
    _log(f"{args.op_id}: flapping {', '.join(chains)}")
    code = run(chains, args.period, args.down_fraction, args.until_ns)
    _log(f"{args.op_id}: done, {'chains removed' if code == 0 else 'REMOVAL FAILED'}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
