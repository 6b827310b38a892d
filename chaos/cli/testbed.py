"""``mlchaos testbed up|down|status``: a multi-host testbed on this machine (see :mod:`chaos.testbed.namespaces`),
with ``--slurm`` a Slurm cluster on it (see :mod:`chaos.testbed.slurm`), or with ``--docker`` one of
Docker containers (see :mod:`chaos.testbed.containers`).

``register(app)`` adds the ``testbed`` sub-app to the main Typer app. ``up`` prints only the inventory path
on stdout (progress goes to stderr), so ``INV=$(mlchaos testbed up --hosts 3)`` works in scripts.
Exit codes: 0 done / healthy, 1 failed / not healthy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chaos.testbed import containers as docker_testbed
from chaos.testbed import namespaces as testbed
from chaos.testbed import slurm as slurm_testbed
from chaos.testbed.slurm_conf import SlurmSettings
from chaos.testbed.system import TestbedError

_err = Console(stderr=True)
_State = TypeVar("_State", testbed.TestbedStatus, docker_testbed.TestbedStatus)  # a testbed flavour's status

Docker = Annotated[
    bool,
    typer.Option("--docker", help="a testbed of Docker containers (state: <mlchaos state dir>/docker-testbed)"),
]

StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="testbed state folder (default: <mlchaos state dir>/testbed)"),
]


def register(app: typer.Typer) -> None:
    """Add the ``testbed`` command group to ``app``."""
    group = typer.Typer(
        help="Hosts on this machine: network namespaces on a private bridge, each with a real sshd (root); "
        "with --docker, containers on a private Docker network.",
        no_args_is_help=True,
    )
    group.command("up")(up)
    group.command("down")(down)
    group.command("status")(status)
    app.add_typer(group, name="testbed")


def _say(line: str) -> None:
    _err.print(escape(line))


def up(
    hosts: Annotated[int, typer.Option("--hosts", "-n", min=1, max=testbed.MAX_HOSTS, help="number of hosts")] = 3,
    state_dir: StateDir = None,
    subnet: Annotated[str | None, typer.Option(help="IPv4 /24 (default: a free 10.213.X.0/24)")] = None,  # noqa: UP007
    docker: Docker = False,
    share: Annotated[
        list[Path] | None,  # noqa: UP007
        typer.Option(
            "--share",
            help="--docker: a folder bind-mounted read-write at the same path in every container (repeatable; "
            "default: /tmp and ./reports)",
        ),
    ] = None,
    slurm: Annotated[
        bool,
        typer.Option(
            "--slurm",
            help="also run Slurm: munged and slurmctld here, one slurmd per host (Debian's slurm-wlm and munge)",
        ),
    ] = False,
    health_check: Annotated[
        str | None,  # noqa: UP007
        typer.Option(
            "--health-check",
            help="--slurm: HealthCheckProgram, an absolute path each slurmd runs, or `builtin`: mlchaos's own "
            "(chaos.slurm.healthcheck: xid, peers, memory, cpu; config and program written to the state dir)",
        ),
    ] = None,
    health_check_interval: Annotated[
        int, typer.Option("--health-check-interval", min=0, help="--slurm: HealthCheckInterval in seconds")
    ] = 0,
    requeue_exit: Annotated[
        list[int] | None,  # noqa: UP007
        typer.Option("--requeue-exit", help="--slurm: a batch exit code that requeues the job (repeatable)"),
    ] = None,
    etcd: Annotated[
        bool,
        typer.Option(
            "--etcd",
            help="also run etcd (v2 API, port 2379) on the last host, in inventory group etcd: the store of "
            "rdzv_backend: etcd-v2 scenarios (Debian's etcd-server)",
        ),
    ] = False,
) -> None:
    """Build or repair an N-host testbed; print the inventory file's path."""
    if etcd and (docker or slurm):
        _err.print("[red]--etcd is not supported with --docker or --slurm[/red]")
        raise typer.Exit(1)
    if docker:
        if slurm:
            _err.print("[red]--slurm is not supported with --docker[/red]")
            raise typer.Exit(1)
        _docker_up(hosts, state_dir, subnet, share)
        return
    if share:
        _err.print("[red]--share needs --docker[/red] (namespace hosts already share this filesystem)")
        raise typer.Exit(1)
    if not slurm and (health_check is not None or health_check_interval or requeue_exit):
        _err.print("[red]--health-check, --health-check-interval and --requeue-exit need --slurm[/red]")
        raise typer.Exit(1)
    try:
        if slurm:
            program = Path(health_check) if health_check not in (None, BUILTIN) else None
            if health_check == BUILTIN:
                program = builtin_health_check(state_dir or testbed.default_state_dir())
            settings = SlurmSettings(
                health_check_program=program,
                health_check_interval=health_check_interval,
                requeue_exit=tuple(requeue_exit or ()),
            )
            cluster = slurm_testbed.up(hosts, state_dir, settings=settings, subnet=subnet, log=_say)
            _err.print(escape(f"Slurm commands here need: export SLURM_CONF={cluster.conf}"), soft_wrap=True)
        else:
            if slurm_testbed.present(state_dir):  # `up` makes the testbed asked for: this one has no Slurm
                slurm_testbed.down(state_dir, log=_say)
            testbed.up(hosts, state_dir, subnet=subnet, etcd=etcd, log=_say)
    except testbed.TestbedError as exc:
        _err.print(f"[red]testbed up failed:[/red] {escape(str(exc))}")
        _err.print("run `mlchaos testbed down` to remove what was built")
        raise typer.Exit(1) from None
    typer.echo(str(testbed.Layout.of(state_dir or testbed.default_state_dir()).inventory))


def down(
    state_dir: StateDir = None,
    all_: Annotated[
        bool, typer.Option("--all", help="remove EVERY chaos-tb namespace and chtb link here, whoever made them")
    ] = False,
    docker: Docker = False,
) -> None:
    """Remove the testbed: its Slurm daemons, processes, namespaces, links and files (--docker: containers,
    network, image)."""
    try:
        if docker:
            lines = docker_testbed.down_all(log=_say) if all_ else docker_testbed.down(state_dir, log=_say)
        else:
            lines = testbed.down_all(log=_say) if all_ else testbed.down(state_dir, log=_say)
    except testbed.TestbedError as exc:
        _err.print(f"[red]testbed down failed:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from None
    if not lines:
        _say("nothing to remove")


def status(state_dir: StateDir = None, docker: Docker = False) -> None:
    """Show each host's namespace, sshd and reachability (--docker: container, state, address, exec); exit 1
    unless all are healthy."""
    if docker:
        _docker_status(state_dir)
        return
    state, table = _status_table(
        "testbed", testbed.status, state_dir, ("host", "namespace", "address", "sshd pid", "reachable")
    )
    for host in state.hosts:
        table.add_row(
            host.name,
            host.namespace if host.namespace_exists else f"[red]{host.namespace} (missing)[/red]",
            host.address,
            str(host.sshd_pid) if host.sshd_pid is not None else "[red]not running[/red]",
            "yes" if host.reachable else "[red]no[/red]",
        )
    table.caption = (
        f"root link: {'up' if state.root_link else 'MISSING'}, hub: {'up' if state.hub else 'MISSING'}; "
        f"inventory: {state.inventory or 'none'}"
    )
    slurm = slurm_testbed.status(state_dir)
    if slurm is not None:
        slurmds = ", ".join(f"{node} {pids[0] if pids else 'DOWN'}" for node, pids in slurm.slurmd.items())
        table.caption += (
            f"\nslurm: munged {slurm.munged[0] if slurm.munged else 'DOWN'}, "
            f"slurmctld {slurm.slurmctld[0] if slurm.slurmctld else 'DOWN'}, slurmd {slurmds or 'none'}"
        )
    healthy = state.healthy and (slurm is None or slurm.healthy)
    _print_health(table, healthy, "mlchaos testbed up" + (" --slurm" if slurm is not None else ""))


def _docker_up(hosts: int, state_dir: Path | None, subnet: str | None, shares: list[Path] | None) -> None:
    if subnet is not None:
        _err.print("[red]--subnet is not supported with --docker[/red] (a free 10.214.X.0/24 is chosen)")
        raise typer.Exit(1)
    try:
        docker_testbed.up(hosts, state_dir, shares=shares or None, log=_say)
    except docker_testbed.TestbedError as exc:
        _err.print(f"[red]docker testbed up failed:[/red] {escape(str(exc))}")
        _err.print("run `mlchaos testbed down --docker` to remove what was built")
        raise typer.Exit(1) from None
    typer.echo(str(docker_testbed.Layout.of(state_dir or docker_testbed.default_state_dir()).inventory))


def _docker_status(state_dir: Path | None) -> None:
    columns = ("host", "container", "state", "address", "exec")
    state, table = _status_table("docker testbed", docker_testbed.status, state_dir, columns)
    for host in state.hosts:
        table.add_row(
            host.name,
            host.container,
            host.state if host.state == "running" else f"[red]{host.state}[/red]",
            host.address or "[red]none[/red]",
            "ok" if host.exec_ok else "[red]fails[/red]",
        )
    table.caption = f"network {state.network}: {'up' if state.network_exists else 'MISSING'}; inventory: {state.inventory or 'none'}"
    _print_health(table, state.healthy, "mlchaos testbed up --docker")


def _status_table(
    what: str, read: Callable[[Path | None], _State], state_dir: Path | None, columns: tuple[str, ...]
) -> tuple[_State, Table]:
    """``read(state_dir)`` and the empty per-host table of that built testbed; exit 1 saying why when its status
    could not be read or none is built for ``state_dir``."""
    try:
        state = read(state_dir)
    except TestbedError as exc:
        _err.print(f"[red]testbed status failed:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from None
    if not state.built:
        Console().print(f"no {what} is up for {escape(str(state.state_dir))}")
        raise typer.Exit(1)
    table = Table(title=f"{what} {state.tag} on {state.subnet or '?'}")
    for column in columns:
        table.add_column(column)
    return state, table


def _print_health(table: Table, healthy: bool, repair: str) -> None:
    """Print the filled table; exit 1, naming the command that repairs it, unless the testbed is healthy."""
    console = Console()
    console.print(table)
    if not healthy:
        console.print(f"[red]not healthy[/red]: `{repair}` repairs it")
        raise typer.Exit(1)


BUILTIN = "builtin"


def builtin_health_check(state_dir: Path) -> Path:
    """Write mlchaos's health-check config (``resume: true``) and the program slurmd runs into the testbed's Slurm
    folder; the program's path. The XID log it reads is the ``gpu_xid`` injector's default (``/var/lib/mlchaos/xid/<node>.log``:
    on the testbed a node's name is its host's), so a scenario's ``gpu_xid`` fault reaches it unchanged."""
    import yaml

    from chaos.slurm.healthcheck import write_program
    from chaos.testbed.slurm_daemons import SLURM_DIR
    from injectors.gpu_xid import DEFAULT_LOG

    folder = state_dir.resolve() / SLURM_DIR
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "healthcheck.yaml"
    settings = {
        "slurm_conf": str(folder / "slurm.conf"),
        "log": str(folder / "healthcheck-{node}.log"),
        "xid": {"logs": [DEFAULT_LOG.replace("{host}", "{node}")]},
        # A testbed node the check drained comes back once it passes again (the emulated fault healed), so the
        # next run starts on a whole cluster; on a real cluster an operator decides (resume: false, the default).
        "resume": True,
    }
    config.write_text(yaml.safe_dump(settings, sort_keys=False), encoding="utf-8")
    return write_program(folder / "healthcheck", config)
