"""One model server of the reference serving stack: a real torch model behind a small HTTP/1.1 API.

``python -m chaos.reference.serving.model_server --replica NAME --model primary|small|lm --port P --seed S
--delay SECONDS --workers N --run-dir DIR [--token-delay SECONDS --max-tokens N]``

Contracts:

- ``POST /v1/predict`` (body per :mod:`chaos.reference.serving.wire`) answers 200
  ``{"output": [...], "label": int, "backend": NAME}`` with header ``X-Backend: NAME``; 400 for a bad body.
- ``--model lm`` (:mod:`~chaos.reference.serving.token_model`) also serves ``POST /v1/chat/completions`` per
  :mod:`~chaos.reference.serving.chat`, streamed or whole: prefill (``--delay``, in a worker slot, plus the
  silent replay of ``resume_from`` tokens), then ``--token-delay`` before each token (emulating a big model's
  pace, not in a slot: decoding is batched), ``min(max_tokens, --max-tokens)`` tokens (default
  ``--max-tokens``). Every token is one real forward and one agent step, like an inference. ``/v1/predict``
  on it runs the model's probe path (:meth:`TokenModel.forward`).
- ``GET /healthz`` answers 200 ``{"ok": true, "replica": NAME}`` WITHOUT running the model: it is a liveness
  probe, so a replica whose weights are corrupted still passes it (the gateway's correctness probe is what
  catches that).
- Compute: at most ``--workers`` inferences at once (the rest wait); each sleeps ``--delay`` seconds (the
  simulated accelerator time, no CPU) and then runs the real forward, one at a time.
- In-job faults: every inference is one agent step. The n-th inference (n from 1, in the order they take
  the forward lock) calls ``agent.begin_step(n)`` before its forward and ``agent.end_step()`` after, so a
  planned ``bitflip`` at ``at_step: n`` on this replica's rank (env ``RANK``) corrupts the real weights that
  the n-th and later inferences use. The agent marks fired faults in ``CHAOS_RUN_DIR``, so a restarted
  server (fresh, clean weights) is not corrupted again by the same fault.
- Golden answer: before serving, with clean weights, the answer to ``PROBE_INPUT`` is written to
  ``DIR/golden-<model>.json`` unless that file exists (see :func:`wire.write_golden_once`).
- Events (rank from env ``RANK``): ``serving.replica_start`` {replica, pid, port, model} once listening.
- SIGTERM or SIGINT: stop accepting, heal in-job faults (``agent.close()``), exit 0.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field
from pathlib import Path

import torch
from torch import nn

from chaos import events
from chaos.agent import Agent, attach
from chaos.event_kinds import SERVING_REPLICA_START as REPLICA_START
from chaos.reference.serving.chat import (
    CHAT_PATH,
    ChatRequest,
    ClientGone,
    StreamWriter,
    chunk,
    completion,
    parse_chat,
    stream_format,
)
from chaos.reference.serving.models import build_model, predict
from chaos.reference.serving.token_model import VOCAB, Generation, TokenModel, build_token_model
from chaos.reference.serving.wire import (
    HEALTH_PATH,
    PREDICT_PATH,
    PROBE_INPUT,
    JsonHandler,
    RequestError,
    finite_or_none,
    parse_predict,
    prompt_features,
    serve_until_signalled,
    write_golden_once,
)


@dataclass(eq=False)
class Replica:
    """The model, its agent and the compute limits; :meth:`infer` is safe to call from many threads."""

    name: str
    model: nn.Module
    agent: Agent
    _: KW_ONLY
    delay: float
    workers: InitVar[int]  # inferences at once
    token_delay: float = 0.0
    max_tokens: int = 32
    seed: int = 0
    # one forward at a time: the agent's step counter is global
    _forward: threading.Lock = field(init=False, default_factory=threading.Lock)
    _steps: int = field(init=False, default=0)
    _answers: Iterator[int] = field(init=False, default_factory=itertools.count)

    def __post_init__(self, workers: int) -> None:
        self._slots = threading.Semaphore(workers)

    @property
    def chat(self) -> bool:
        return isinstance(self.model, TokenModel)

    def answer_id(self) -> str:
        return f"chatcmpl-{self.name}-{os.getpid()}-{next(self._answers)}"

    def tokens(self, request: ChatRequest) -> Iterator[int]:
        """The answer's token ids from ``request.resume_from`` on, paced as the module docstring says."""
        assert isinstance(self.model, TokenModel)
        count = min(request.max_tokens or self.max_tokens, self.max_tokens)
        with self._slots:
            if self.delay > 0:
                time.sleep(self.delay)
            with self._forward:
                gen = Generation(self.model, prompt_features(request.prompt), request.prompt, self.seed)
            for _ in range(min(request.resume_from, count)):
                self._step(gen.next)
        for _ in range(request.resume_from, count):
            if self.token_delay > 0:
                time.sleep(self.token_delay)
            yield self._step(gen.next)

    def _step(self, forward: Callable[[], int]) -> int:
        with self._forward:
            self._steps += 1
            self.agent.begin_step(self._steps)
            try:
                return forward()
            finally:
                self.agent.end_step()

    def infer(self, features: list[float]) -> list[float]:
        with self._slots:
            if self.delay > 0:
                time.sleep(self.delay)
            with self._forward:
                self._steps += 1
                self.agent.begin_step(self._steps)  # weight faults due at this inference fire here
                try:
                    return predict(self.model, features)
                finally:
                    self.agent.end_step()

    def close(self) -> None:
        """Heal in-job faults once no forward is running (a heal mid-forward would mix weights)."""
        with self._forward:
            self.agent.close()


def _handler(replica: Replica) -> type[JsonHandler]:
    backend_header = {"X-Backend": replica.name}

    class Handler(JsonHandler):
        def do_GET(self) -> None:
            if self.path == HEALTH_PATH:
                self.send_json(200, {"ok": True, "replica": replica.name})
            else:
                self.send_json(404, {"error": f"no such path: {self.path}"})

        def do_POST(self) -> None:
            body = self.read_body()
            if body is None:
                return
            if self.path == CHAT_PATH and replica.chat:
                self._chat(body)
                return
            if self.path != PREDICT_PATH:
                self.send_json(404, {"error": f"no such path: {self.path}"})
                return
            try:
                features = parse_predict(body)
            except RequestError as exc:
                self.send_json(400, {"error": str(exc)})
                return
            output = replica.infer(features)
            # argmax over finite values only: a NaN would otherwise make the label arbitrary.
            finite = [(v, i) for i, v in enumerate(output) if math.isfinite(v)]
            label = max(finite)[1] if finite else -1
            answer = {"output": finite_or_none(output), "label": label, "backend": replica.name}
            self.send_json(200, answer, backend_header)

        def _chat(self, body: bytes) -> None:
            try:
                request = parse_chat(body)
            except RequestError as exc:
                self.send_json(400, {"error": str(exc)})
                return
            answer_id, name = replica.answer_id(), replica.name
            if not request.stream:
                words = [VOCAB[t] + " " for t in replica.tokens(request)]
                prompt_tokens = len(request.prompt.split())
                self.send_json(
                    200, completion(answer_id, name, "".join(words), prompt_tokens, len(words)), backend_header
                )
                return
            out = StreamWriter(self, stream_format(self.headers.get("Accept")))
            try:
                out.start(name)
                if request.resume_from == 0:
                    out.event(chunk(answer_id, name, role=True))
                for position, token in enumerate(replica.tokens(request), start=request.resume_from):
                    out.event(chunk(answer_id, name, content=VOCAB[token] + " ", token=position))
                out.event(chunk(answer_id, name, finish="length"))
                out.finish()
            except ClientGone:
                self.close_connection = True

    return Handler


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chaos.reference.serving.model_server", description=__doc__.splitlines()[0])
    parser.add_argument("--replica", required=True, help="this server's name (the backend a response names)")
    parser.add_argument("--model", required=True, choices=["primary", "small", "lm"])
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--seed", type=int, default=0, help="the weights are a pure function of it")
    parser.add_argument("--delay", type=float, default=0.0, help="simulated compute per inference, seconds")
    parser.add_argument("--workers", type=int, default=4, help="inferences served at once")
    parser.add_argument("--run-dir", type=Path, required=True, help="where the golden answer is written")
    parser.add_argument("--token-delay", type=float, default=0.0, help="lm: pause before each token, seconds")
    parser.add_argument("--max-tokens", type=int, default=32, help="lm: tokens per answer (and the most asked)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.workers < 1 or args.delay < 0 or args.token_delay < 0 or args.max_tokens < 1:
        raise SystemExit("--workers and --max-tokens must be >= 1, --delay and --token-delay >= 0")
    torch.set_num_threads(1)  # the box also runs the gateway and the load: one core's worth at most
    model_name: str = args.model
    model = build_token_model(args.seed) if model_name == "lm" else build_model(args.model, args.seed)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    # Before the agent exists and before any request: these weights are the clean ones.
    write_golden_once(args.run_dir, model_name, predict(model, list(PROBE_INPUT)))
    agent = attach(model, job_emits="all")  # a server, not a training loop: no steps, no digest to report
    replica = Replica(
        args.replica,
        model,
        agent,
        delay=args.delay,
        workers=args.workers,
        token_delay=args.token_delay,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )

    def announce(port: int) -> None:
        events.emit(REPLICA_START, replica=args.replica, pid=os.getpid(), port=port, model=model_name)

    serve_until_signalled(args.port, _handler(replica), f"model server {args.replica} ({model_name})", announce)
    replica.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
