"""Any command as a target: its log lines become events through the scenario's matchers; ``name:`` process
selectors match only the command's own process tree (:meth:`CommandJob.job_tree`)."""

from __future__ import annotations

from pathlib import Path

from chaos.cluster.base import Transport
from chaos.history.timeline import Event
from chaos.plugins.injector import JobTree
from chaos.spec.scenario import CommandTarget
from chaos.targets.base import SpawnedJob, output_matchers, with_step_reporter
from chaos.targets.interpreter import command_argv, torchrun_log_env
from chaos.targets.process_tree import tree


def expand(template: str, values: dict[str, str]) -> str:
    """Replace ``{run_dir}``-style placeholders; other braces are left alone."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


class CommandJob:
    """Runs ``spec.command`` (argv, placeholders ``{run_dir}``, ``{seed}`` and ``{python}`` expanded)."""

    def __init__(
        self,
        spec: CommandTarget,
        transport: Transport,
        run_dir: Path,
        seed: int,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        values = {"run_dir": str(run_dir), "seed": str(seed)}
        # {python} and a python: the target names (chaos.targets.interpreter); the rest runs as written.
        argv = [expand(part, values) for part in command_argv(spec, values)]
        env = {
            **torchrun_log_env(str(run_dir)),
            **(extra_env or {}),
            **{k: expand(v, values) for k, v in spec.env.items()},
        }
        env = with_step_reporter(env, wanted=spec.optimizer_steps, matchers=spec.matchers, transport=transport)
        matchers = output_matchers(spec.signatures, spec.matchers)
        self.job = SpawnedJob(transport, argv, env=env, run_dir=run_dir, matchers=matchers)

    def start(self) -> None:
        self.job.start()

    def poll_events(self) -> list[Event]:
        return self.job.poll_events()

    def exit_code(self) -> int | None:
        return self.job.exit_code()

    def stop(self, grace: float = 10.0) -> None:
        self.job.stop(grace)

    def describe(self) -> str:
        return " ".join(self.job.argv)

    def job_tree(self, host: str) -> JobTree:
        """The command's process (the launcher) and every process below it now, on the host it runs on (``name:``
        selectors match only inside it, so a pattern never hits a stranger elsewhere on the machine); empty once
        it has exited; ``here`` False on any other host (a fault there matches across that host)."""
        pid = self.job.pid
        if host != self.job.transport.host:
            return JobTree(frozenset(), frozenset(), here=False)
        if pid is None or self.job.exit_code() is not None:
            return JobTree(frozenset(), frozenset())
        below = set(tree(pid)) - {pid}
        return JobTree(frozenset({pid}), frozenset(below))
