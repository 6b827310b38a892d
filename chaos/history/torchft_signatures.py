"""torchft's own word on a lost replica group, read from a group's output: a detection for a torchft script
nobody edited for mlchaos.

torchft does not fail a step when a replica group dies or freezes: the lighthouse drops the group from the
quorum once its heartbeats stop (``--heartbeat_timeout_ms``) and the survivors go on in a smaller quorum. The
only trace in a survivor's output is torchft's manager logging each quorum it got (at INFO, which torchft 0.2.0
prints by default)::

    [INFO] [torchft::manager] - [Replica user_torchft_0] got lighthouse quorum LighthouseQuorumResponse {
        quorum: Some(Quorum { quorum_id: 3, participants: [QuorumMember { replica_id: "user_torchft_0:2880...",

:class:`TorchftQuorum` reads those lines per replica group's output:

- ``[Replica X] Manager listening on ...`` (the group's own first line) -> ``target.torchft_replica``
  {replica_id: X}: which torchft replica id this output belongs to;
- a quorum without a member the previous quorum had (a member is one process of a group: torchft appends a
  fresh ``:uuid`` to the replica id at every start, so a group that died and came back before its heartbeat
  ran out is a member lost and another joined) -> ``detect.peer_lost`` {lost: [ids], quorum_id,
  participants, detector: torchft, signature: torchft_quorum_shrank}: torchft's detection of the loss.

Replica ids are torchft's (the ``replica_id`` the job gave its Manager, without the ``:uuid`` torchft appends);
the ``roles`` target names the replica groups they belong to (:mod:`chaos.targets.roles`).
"""

from __future__ import annotations

import re

from pydantic import JsonValue

from chaos.event_kinds import DETECT_PEER_LOST
from chaos.event_kinds import TARGET_TORCHFT_REPLICA as TORCHFT_REPLICA
from chaos.history.timeline import Event

NAME = "torchft_quorum"
_LISTENING = re.compile(r"\[Replica (?P<id>[^\]\s]+)\] Manager listening on")
_QUORUM = re.compile(r"got lighthouse quorum .*?quorum_id: (?P<quorum>\d+), participants: \[(?P<members>.*)")
_MEMBER = re.compile(r'replica_id: "(?P<id>[^"]+)"')


class TorchftQuorum:
    """A line matcher with memory (one per replica group's output): the quorum before this one."""

    def __init__(self) -> None:
        self.members: set[str] | None = None

    def match(self, line: str, ts_ns: int) -> Event | None:
        if "torchft" not in line and "Replica" not in line:
            return None
        own = _LISTENING.search(line)
        if own is not None:
            fixed: dict[str, JsonValue] = {"replica_id": own["id"], "detector": "torchft"}
            return Event(ts_ns=ts_ns, kind=TORCHFT_REPLICA, source="log", data=fixed)
        quorum = _QUORUM.search(line)
        if quorum is None:
            return None
        members = set(_MEMBER.findall(quorum["members"]))
        before, self.members = self.members, members
        lost = sorted({member.split(":")[0] for member in before - members}) if before is not None else []
        if not lost:
            return None
        participants = sorted(member.split(":")[0] for member in members)
        data: dict[str, JsonValue] = {
            "lost": list(lost),
            "quorum_id": int(quorum["quorum"]),
            "participants": participants,
        }
        data |= {"detector": "torchft", "signature": "torchft_quorum_lost"}
        return Event(ts_ns=ts_ns, kind=DETECT_PEER_LOST, source="log", data=data)
