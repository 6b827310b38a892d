"""The reference serving stack (:mod:`chaos.reference.serving`, started by module path) as a target: model
server processes (primary, fallback) and a gateway, run as the roles of a :class:`~chaos.targets.roles.RolesJob` (one supervisor for every multi-process target).

Contracts:

- :meth:`ServingJob.start` writes the gateway's config and spawns every process at once (each model server
  imports torch, ~2 s) and returns; the stack is ready when the gateway reports :attr:`ServingJob.ready_event`
  (``serving.ready``), which the runner waits for before it starts load and the fault clock.
- Roles ``primary``, ``fallback`` (when configured) and ``gateway``, each one process with its own log
  (``<name>.log``) and, per attempt, event file (see :mod:`chaos.targets.roles`). A replica's exit is
  ``target.role_exit`` and its restart ``target.role_restart`` (restart policy ``always`` after
  ``restart_delay`` when the replica's ``restart`` is on, else ``never``), never ``target.exit``.
- Model servers get ``RANK`` = ``REPLICA_RANKS[name]`` (in-job faults select a replica by rank),
  ``WORLD_SIZE=2``, ``CHAOS_RUN_DIR``, the runner's ``extra_env`` (``CHAOS_PLAN``) and ``spec.env``; ``RANK``
  and ``WORLD_SIZE`` last, so no scenario env can make a replica impersonate another rank.
- Only the gateway's exit is the target's exit (``target.exit``, :meth:`exit_code`).
- :meth:`stop` ends the gateway and every replica (SIGTERM, then SIGKILL after ``grace``), in parallel.
"""

from __future__ import annotations

import os
from pathlib import Path

from chaos.cluster.local import LocalTransport
from chaos.cluster.ports import free_port
from chaos.event_kinds import SERVING_READY as READY
from chaos.spec.roles import RestartPolicy, RoleSpec, RolesTarget
from chaos.spec.serving import (
    FALLBACK,
    PRIMARY,
    REPLICA_RANKS,
    GatewayConfig,
    ReplicaEndpoint,
    ReplicaSettings,
    ServingTarget,
)
from chaos.targets.roles import RolesJob

GATEWAY = "gateway"
_CONFIG = "gateway-config.json"
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the chaos package


def _env(base: dict[str, str]) -> dict[str, str]:
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
    return {**base, "PYTHONPATH": path}


def _roles(spec: ServingTarget, ports: dict[str, int], gateway_port: int, run_dir: Path, seed: int) -> RolesTarget:
    """The stack as a roles target: the model servers (each on its port, restarted by its setting), then the
    gateway; the stack ends when the gateway does."""
    settings: dict[str, ReplicaSettings] = {PRIMARY: spec.primary}
    if spec.fallback is not None:
        settings[FALLBACK] = spec.fallback
    roles: dict[str, RoleSpec] = {}
    for name, s in settings.items():
        command = [
            "{python}",
            "-m",
            "chaos.reference.serving.model_server",
            "--replica",
            name,
            "--model",
            s.model,
            "--port",
            str(ports[name]),
            "--seed",
            str(seed),
            "--delay",
            repr(s.delay),
            "--workers",
            str(s.workers),
            "--run-dir",
            str(run_dir),
        ]
        if s.model == "lm":
            command += ["--token-delay", repr(s.token_delay), "--max-tokens", str(s.max_tokens)]
        env = _env(dict(spec.env))
        env.update({"RANK": str(REPLICA_RANKS[name]), "WORLD_SIZE": str(len(REPLICA_RANKS))})
        policy = RestartPolicy(policy="always" if s.restart else "never", delay=s.restart_delay)
        roles[name] = RoleSpec(command=command, env=env, restart=policy, port=ports[name])
    gateway = ["{python}", "-m", "chaos.reference.serving.gateway", "--config-file", str(run_dir / _CONFIG)]
    roles[GATEWAY] = RoleSpec(command=gateway, env=_env(dict(spec.env)), restart=RestartPolicy(policy="never"))
    return RolesTarget(type="roles", roles=roles, until=[GATEWAY], url=f"http://127.0.0.1:{gateway_port}")


class ServingJob(RolesJob):
    """The reference serving stack (see the module docstring for its contracts)."""

    ready_event: str = READY

    def __init__(
        self, spec: ServingTarget, transport: LocalTransport, run_dir: Path, seed: int, extra_env: dict[str, str]
    ) -> None:
        self.serving = spec
        self.ports = {PRIMARY: spec.primary.port or free_port()}
        if spec.fallback is not None:
            self.ports[FALLBACK] = spec.fallback.port or free_port()
        self.port = spec.port or free_port()
        super().__init__(_roles(spec, self.ports, self.port, run_dir, seed), transport, run_dir, seed, extra_env)

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = GatewayConfig(
            target=self.serving,
            port=self.port,
            run_dir=self.run_dir,
            replicas={
                name: ReplicaEndpoint(model=settings.model, port=self.ports[name])
                for name, settings in ((PRIMARY, self.serving.primary), (FALLBACK, self.serving.fallback))
                if settings is not None
            },
        )
        (self.run_dir / _CONFIG).write_text(config.model_dump_json(indent=1), encoding="utf-8")
        super().start()

    def describe(self) -> str:
        models = {PRIMARY: self.serving.primary, FALLBACK: self.serving.fallback}
        names = ", ".join(f"{name} ({s.model}) :{self.ports[name]}" for name, s in models.items() if s is not None)
        return f"serving stack: gateway {self.url} -> {names}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def replicas(self) -> list[str]:
        """The replica names, in ladder order (``primary``, then ``fallback`` when configured)."""
        return list(self.ports)
