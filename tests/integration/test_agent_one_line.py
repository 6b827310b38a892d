"""The one-line agent: ``attach(model, optimizer)`` and a loop with no other call in it. Steps, phases, the skip,
the digest at exit and a collective failure reported on the way out, from hooks on the real module and
optimizer (single process, real torch)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from torch import nn

from chaos.agent import Agent
from chaos.injob import loop_hooks
from chaos.injob.loop_hooks import collective_failure


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, **data: Any) -> None:
        self.events.append((kind, data))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [data for k, data in self.events if k == kind]


def attached(optimizer: str) -> tuple[Recorder, nn.Module, torch.optim.Optimizer, Agent]:
    """A model, its ``optimizer`` (a torch.optim class name) and an agent attached with the one line."""
    said, model = Recorder(), nn.Linear(3, 1)
    kind = getattr(torch.optim, optimizer)
    opt = kind(model.parameters(), lr=0.1) if optimizer == "SGD" else kind(model.parameters())
    return said, model, opt, Agent(model, opt, emit=said)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, accumulate: int = 1) -> None:
    """A loop as users write it: nothing of mlchaos in it."""
    torch.manual_seed(3)
    for _ in range(steps):
        optimizer.zero_grad()
        for _ in range(accumulate):
            model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()


def test_steps_come_from_the_optimizer_and_a_resume_continues_its_count() -> None:
    said, model, optimizer, agent = attached("Adam")
    train(model, optimizer, 4, accumulate=3)  # gradient accumulation: three forwards, one step
    assert [e["step"] for e in said.of("target.step")] == [1, 2, 3, 4]
    agent.close()
    assert len(said.of("target.digest")) == 1 and said.of("target.digest")[0]["step"] == 4

    resumed, after = Recorder(), nn.Linear(3, 1)
    again = torch.optim.Adam(after.parameters())
    after.load_state_dict(model.state_dict())
    again.load_state_dict(optimizer.state_dict())  # a resume: Adam's own count comes back with its state
    second = Agent(after, again, emit=resumed)
    train(after, again, 2)
    assert [e["step"] for e in resumed.of("target.step")] == [5, 6]
    assert [e["step"] for e in resumed.of("target.resume")] == [4]
    second.close()


def test_the_first_explicit_call_takes_over_and_nothing_is_reported_twice() -> None:
    said, model, optimizer, agent = attached("SGD")
    for step in (1, 2):
        agent.begin_step(step)
        model(torch.randn(2, 3)).sum().backward()
        if agent.allow_optimizer_step():
            optimizer.step()
        agent.end_step()
    assert [e["step"] for e in said.of("target.step")] == [1, 2]
    agent.close()


def test_a_step_the_guards_skip_leaves_the_parameters_alone() -> None:
    said, model, optimizer, agent = attached("Adam")
    verdicts = iter([False, True])  # the guards' word on the next two steps: skip, then go
    assert agent._hooks is not None
    agent._hooks.calls.allow = lambda: next(verdicts)
    before = [p.detach().clone() for p in model.parameters()]
    train(model, optimizer, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    train(model, optimizer, 1)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    agent.close()


def test_sgd_after_a_restart_is_not_numbered_and_says_what_to_add(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    said, model, optimizer, agent = attached("SGD")
    train(model, optimizer, 2)
    assert not said.of("target.step")
    [note] = said.of("target.step_source")
    assert note["exact"] is False and "agent.begin_step(step)" in note["reason"]
    agent.close()


def test_the_exit_reports_the_digest_unless_the_process_died_of_an_exception() -> None:
    said, model, optimizer, agent = attached("Adam")
    train(model, optimizer, 2)
    hooks = agent._hooks
    assert hooks is not None
    hooks._at_exit()  # what atexit runs at a normal exit
    assert [d["step"] for d in said.of("target.digest")] == [2]
    agent.close()

    dying = Recorder()
    agent = Agent(nn.Linear(3, 1), torch.optim.Adam(model.parameters()), emit=dying)
    hooks = agent._hooks
    assert hooks is not None
    hooks._previous_excepthook = lambda *args: None  # keep the test's output clean
    error = torch.distributed.DistBackendError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    hooks._uncaught(type(error), error, None)
    hooks._at_exit()
    assert [d["detector"] for d in dying.of("detect.peer_lost")] == ["agent"]
    assert not dying.of("target.digest")
    agent.close()  # undoes the torch.save/load wraps (a dying process needs no undo)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (
            RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv"),
            "detect.collective_timeout",
        ),
        (
            torch.distributed.DistBackendError("NCCL watchdog: collective operation timeout"),
            "detect.collective_timeout",
        ),
        (RuntimeError("Connection reset by peer (gloo)"), "detect.peer_lost"),
        (torch.distributed.DistBackendError("ProcessGroupGloo: invalid size"), "detect.collective_error"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "detect.oom"),
        (ValueError("my script has a bug"), None),
        (TimeoutError("the data loader timed out"), None),
    ],
)
def test_collective_failures_are_told_from_the_scripts_own_errors(error: BaseException, kind: str | None) -> None:
    assert collective_failure(error) == kind


def test_no_optimizer_no_hooks() -> None:
    agent = Agent(nn.Linear(3, 1), emit=Recorder())
    assert agent._hooks is None
    agent.close()
    assert loop_hooks.keeps_count(torch.optim.AdamW(nn.Linear(1, 1).parameters()))
    assert not loop_hooks.keeps_count(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1))


def test_each_hook_can_be_left_out_by_name() -> None:
    said, model = Recorder(), nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters())
    own_hook = sys.excepthook
    agent = Agent(model, optimizer, emit=said, hooks=["forward", "optimizer"])  # a job with its own excepthook
    try:
        assert sys.excepthook is own_hook  # left alone
        train(model, optimizer, 3)
        assert [e["step"] for e in said.of("target.step")] == [1, 2, 3]  # the loop is still followed
    finally:
        agent.close()
    steps_only = Recorder()
    quiet = Agent(nn.Linear(3, 1), torch.optim.Adam(model.parameters()), emit=steps_only, hooks=["excepthook"])
    try:
        assert sys.excepthook is not own_hook  # the one asked for
        train(model, optimizer, 1)
        assert steps_only.of("target.step") == []  # no forward/optimizer hooks: nothing follows the loop
    finally:
        quiet.close()
        assert sys.excepthook is own_hook
