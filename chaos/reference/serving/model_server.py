"""One model server of the reference serving stack: a real torch model behind a small HTTP/1.1 API.

``python -m chaos.reference.serving.model_server --replica NAME --model primary|small --port P --seed S
--delay SECONDS --workers N --run-dir DIR``

Contracts:

- ``POST /v1/predict`` (body per :mod:`chaos.reference.serving.wire`) answers 200
  ``{"output": [...], "label": int, "backend": NAME}`` with header ``X-Backend: NAME``; 400 for a bad body.
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
import math
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from chaos import events
from chaos.agent import Agent, attach
from chaos.event_kinds import SERVING_REPLICA_START as REPLICA_START
from chaos.reference.serving.models import ModelName, build_model, predict
from chaos.reference.serving.wire import (
    HEALTH_PATH,
    PREDICT_PATH,
    PROBE_INPUT,
    JsonHandler,
    RequestError,
    Server,
    finite_or_none,
    make_server,
    parse_predict,
    serve_until_signalled,
    write_golden_once,
)


class Replica:
    """The model, its agent and the compute limits; :meth:`infer` is safe to call from many threads."""

    def __init__(self, name: str, model: nn.Module, agent: Agent, *, delay: float, workers: int) -> None:
        self.name = name
        self.model = model
        self.agent = agent
        self.delay = delay
        self._slots = threading.Semaphore(workers)
        self._forward = threading.Lock()  # one forward at a time: the agent's step counter is global
        self._steps = 0

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

    return Handler


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chaos.reference.serving.model_server", description=__doc__.splitlines()[0])
    parser.add_argument("--replica", required=True, help="this server's name (the backend a response names)")
    parser.add_argument("--model", required=True, choices=["primary", "small"])
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--seed", type=int, default=0, help="the weights are a pure function of it")
    parser.add_argument("--delay", type=float, default=0.0, help="simulated compute per inference, seconds")
    parser.add_argument("--workers", type=int, default=4, help="inferences served at once")
    parser.add_argument("--run-dir", type=Path, required=True, help="where the golden answer is written")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.workers < 1 or args.delay < 0:
        raise SystemExit("--workers must be >= 1 and --delay >= 0")
    torch.set_num_threads(1)  # the box also runs the gateway and the load: one core's worth at most
    model_name: ModelName = args.model
    model = build_model(model_name, args.seed)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    # Before the agent exists and before any request: these weights are the clean ones.
    write_golden_once(args.run_dir, model_name, predict(model, list(PROBE_INPUT)))
    agent = attach(model, job_emits="all")  # a server, not a training loop: no steps, no digest to report
    replica = Replica(args.replica, model, agent, delay=args.delay, workers=args.workers)

    server: Server = make_server(args.port, _handler(replica))
    port = server.server_address[1]

    def announce() -> None:
        events.emit(REPLICA_START, replica=args.replica, pid=os.getpid(), port=port, model=model_name)
        print(f"model server {args.replica} ({model_name}) listening on 127.0.0.1:{port}", flush=True)

    serve_until_signalled(server, announce)
    replica.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
