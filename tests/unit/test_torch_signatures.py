"""torch's failure signatures: real lines from torch 2.13 jobs become the detections the checks read, on the rank
that printed them; lines that only look alike (HAProxy's, a server's, a traceback's inner lines) do not."""

from __future__ import annotations

import pytest

from chaos.history.torch_signatures import NAMES, chosen, signature_matcher
from chaos.spec.scenario import TorchrunTarget
from chaos.targets.base import output_matchers

# Printed by torch 2.13 (CPU, gloo) under torchrun on this machine: rank 1 frozen past a 5 s timeout, then
# rank 1 SIGKILLed mid all-reduce (tests/jobs-style scripts, see the module docstring of the signatures).
GLOO_TIMEOUT = (
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
    "Timed out waiting 5000ms for recv operation to complete"
)
PEER_RESET = (
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:45280: Connection reset by peer. This is typically caused by a remote worker hanging or bugs in "
    "the application. Check the logs of the remote worker before reporting an error. GLHF!"
)
WORKER_FAILED = (
    "E1128 14:35:03.092000 20513 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
    "local_rank: 1 (pid: 20843) of binary: /work/main/.venv/bin/python"
)
RESTART = "[default] Worker group FAILED. 2/3 attempts left; will restart worker group"
STORE = (
    "[rank1]: torch.distributed.DistNetworkError: The client socket has failed to connect to [localhost]:29500 "
    "(errno: 111 - Connection refused)."
)
OOM = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
CPU_OOM = "[rank0]: RuntimeError: [enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory"
NCCL_WATCHDOG = (
    "[rank1]:[E1128 10:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600081 milliseconds before timing out."
)
USER_ERROR = "[rank1]: ValueError: loss is nan at step 40"


@pytest.mark.parametrize(
    ("line", "kind", "rank", "fields"),
    [
        (GLOO_TIMEOUT, "detect.collective_timeout", 0, {"timeout_ms": 5000, "op": "recv", "signature": "gloo_timeout"}),
        (PEER_RESET, "detect.peer_lost", 0, {"peer": "127.0.0.1", "detector": "gloo"}),
        (WORKER_FAILED, "detect.worker_exit", 1, {"exitcode": -9, "pid": 20843, "detector": "torchrun"}),
        (RESTART, "target.agent_restart", None, {"attempts_left": 2, "max_restarts": 3}),
        (STORE, "detect.peer_lost", 1, {"signature": "connect_failed"}),
        (OOM, "detect.oom", 1, {}),
        (CPU_OOM, "detect.oom", 0, {}),
        (NCCL_WATCHDOG, "detect.collective_timeout", 1, {"timeout_ms": 600000}),
        (USER_ERROR, "detect.worker_error", 1, {"error": "ValueError: loss is nan at step 40"}),
    ],
)
def test_a_signature_line_is_one_event_on_the_rank_that_printed_it(
    line: str, kind: str, rank: int | None, fields: dict[str, object]
) -> None:
    event = signature_matcher().match(line, 7)
    assert event is not None, line
    assert (event.kind, event.rank, event.ts_ns) == (kind, rank, 7)
    for key, value in fields.items():
        assert event.data[key] == value, (key, event.data)


@pytest.mark.parametrize(
    "line",
    [
        '[rank0]:   File "/tmp/train.py", line 8, in <module>',  # a traceback's inner line
        "[rank0]: Traceback (most recent call last):",
        "step 25 loss 0.31",
        # HAProxy and a web server say "refused" and "reset" about their own clients and backends.
        '[WARNING] Server fleet/primary is DOWN, reason: Layer4 connection problem, info: "Connection refused"',
        "ConnectionResetError: [Errno 104] Connection reset by peer",
        "RuntimeError: something else",  # no rank prefix: not torch's excepthook output
    ],
)
def test_lines_that_only_look_alike_are_no_detection(line: str) -> None:
    assert signature_matcher().match(line, 1) is None


def test_a_chosen_list_keeps_only_those_and_none_keeps_nothing() -> None:
    only = signature_matcher(["gloo_timeout"])
    assert only.match(GLOO_TIMEOUT, 1) is not None
    assert only.match(PEER_RESET, 1) is None
    assert chosen("none") == [] and [s.name for s in chosen("all")] + ["torchft_quorum"] == list(NAMES)


def test_a_target_reads_signatures_and_its_own_matchers_and_can_turn_signatures_off() -> None:
    spec = TorchrunTarget.model_validate(
        {
            "type": "torchrun",
            "script": "train.py",
            "matchers": [{"pattern": r"step (?P<step>\d+)", "event": "target.step"}],
        }
    )
    matchers = output_matchers(spec.signatures, spec.matchers)
    assert [m.match(GLOO_TIMEOUT, 1).kind for m in matchers if m.match(GLOO_TIMEOUT, 1)] == [
        "detect.collective_timeout"
    ]
    step = [e for m in matchers if (e := m.match("[rank1]: step 12", 1)) is not None]
    assert [(e.kind, e.rank, e.data["step"]) for e in step] == [("target.step", 1, 12)]  # rank from torch's prefix
    off = TorchrunTarget.model_validate({"type": "torchrun", "script": "train.py", "signatures": "none"})
    assert output_matchers(off.signatures, off.matchers) == []


def test_an_unknown_signature_name_is_refused_with_the_names_to_choose_from() -> None:
    with pytest.raises(ValueError, match=r"'gloo_timout' is not a signature: choose from gloo_timeout"):
        TorchrunTarget.model_validate({"type": "torchrun", "script": "t.py", "signatures": ["gloo_timout"]})


# torchft 0.2.0's manager, as group 0 of tests/jobs/user_torchft.py printed it on this machine (a quorum of both
# groups; the uuid torchft appends to a replica id is new at every start of a group's process).
TORCHFT_LISTENING = (
    "2026-11-29T00:17:50.251 [INFO] [torchft::manager] - [Replica user_torchft_0] Manager listening on http://vm:38183"
)
G0 = "user_torchft_0:e6ef7277-937c-4e25-802c-9c008bc6ceec"
G1 = "user_torchft_1:66a542ef-ff5d-4a0a-996e-6206ef0e860e"
G1_RESTARTED = "user_torchft_1:0b1e2d3c-4f5a-4b6c-8d7e-9f0a1b2c3d4e"


def quorum_line(quorum_id: int, *members: str) -> str:
    listed = ", ".join(
        f'QuorumMember {{ replica_id: "{m}", address: "http://vm:38183", store_address: "localhost:36549", step: 3, '
        'world_size: 1, shrink_only: false, commit_failures: 0, data: "" }'
        for m in members
    )
    return (
        "2026-11-29T00:17:50.433 [INFO] [torchft::manager] - [Replica user_torchft_0] got lighthouse quorum "
        f"LighthouseQuorumResponse {{ quorum: Some(Quorum {{ quorum_id: {quorum_id}, participants: [{listed}], "
        "created: Some(Timestamp { seconds: 1795911470, nanos: 432346566 }) }) }"
    )


def test_torchfts_quorum_without_a_groups_process_is_a_detection_naming_that_group() -> None:
    reader = signature_matcher("all")
    own = reader.match(TORCHFT_LISTENING, 1)
    assert own is not None and (own.kind, own.data["replica_id"]) == ("target.torchft_replica", "user_torchft_0")
    # The first quorum, the same one again, a group joining: nothing lost.
    assert [reader.match(quorum_line(n, *m), 2) for n, m in ((1, [G0]), (1, [G0]), (2, [G0, G1]), (2, [G0, G1]))] == [
        None
    ] * 4
    # Group 1's process replaced (killed, restarted, rejoined before its heartbeat ran out): the old one is lost.
    replaced = reader.match(quorum_line(3, G0, G1_RESTARTED), 3)
    assert replaced is not None and replaced.kind == "detect.peer_lost", replaced
    assert (replaced.data["lost"], replaced.data["quorum_id"], replaced.data["signature"]) == (
        ["user_torchft_1"],
        3,
        "torchft_quorum_lost",
    )
    # Group 1 gone (frozen past its heartbeat): lost again; its return is not a detection.
    shrunk = reader.match(quorum_line(4, G0), 4)
    assert (
        shrunk is not None
        and shrunk.data["lost"] == ["user_torchft_1"]
        and shrunk.data["participants"] == ["user_torchft_0"]
    )
    assert reader.match(quorum_line(5, G0, G1_RESTARTED), 5) is None
    # Off with the other signatures, or by leaving it out of a list.
    for choice in ("none", ["gloo_timeout"]):
        assert signature_matcher(choice).match(TORCHFT_LISTENING, 1) is None  # type: ignore[arg-type]
    assert "torchft_quorum" in NAMES
