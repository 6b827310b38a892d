"""What a load balancer's own log says about its backends, as history events.

A role with ``balancer: haproxy`` (see :mod:`chaos.spec.roles`) has its output read by these matchers. HAProxy
running in the foreground (``haproxy -db``) writes each server state change to stderr, e.g.::

    [WARNING]  (6227) : Server models/primary is DOWN, reason: Layer4 connection problem, info: "Connection
    refused", check duration: 0ms. 0 active and 1 backup servers left. Running on backup. ...
    [WARNING]  (6227) : Server models/primary is UP, reason: Layer7 check passed, code: 200, ...

They become ``detect.backend_down`` {backend, proxy, reason} (the balancer detected the backend's failure: a
health check, or live traffic with ``observe``) and ``serving.backend_up`` {backend, proxy, reason} (traffic may
go back to it), the events the serving checks (``detected_within``, ``failback_within``, ``until``) read.
"""

from __future__ import annotations

from typing import Literal

from chaos.event_kinds import DETECT_BACKEND_DOWN as BACKEND_DOWN
from chaos.event_kinds import SERVING_BACKEND_UP as BACKEND_UP
from chaos.history.timeline import LogMatcher

BalancerKind = Literal["haproxy"]

_HAPROXY_SERVER = r"Server (?P<proxy>[^/\s]+)/(?P<backend>[^\s]+) is "
HAPROXY_MATCHERS: tuple[LogMatcher, ...] = (
    LogMatcher(_HAPROXY_SERVER + r"DOWN(?:, reason: (?P<reason>[^,.]+))?", BACKEND_DOWN, source="haproxy"),
    LogMatcher(_HAPROXY_SERVER + r"UP(?:, reason: (?P<reason>[^,.]+))?", BACKEND_UP, source="haproxy"),
)


def balancer_matchers(kind: BalancerKind) -> list[LogMatcher]:
    """The log matchers of a balancer ``kind``."""
    if kind == "haproxy":
        return list(HAPROXY_MATCHERS)
    raise ValueError(f"unknown balancer kind {kind!r}")
