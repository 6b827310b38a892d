"""The Docker transport: one container of an inventory, through the Docker Engine API, behind the Transport protocol.

Contracts worth knowing:

* Commands are argv lists, run by ``docker exec`` of ``sh -c`` around :func:`chaos.cluster.remote_process.remote_command`
  (every word ``shlex.quote``d; the shell fragments around it are constants), so the container needs a POSIX
  ``sh`` (the testbed's get this machine's ``/usr``). The shell ``exec``s the command: a pid is the
  command's, in the CONTAINER's pid namespace (what ``kill`` inside understands).
* The container is found BY NAME: a recreated container (new id) under the same name is followed; one
  restarted in place keeps its id. Processes running in the old one are gone with it.
* Execs ask for ``privileged`` (all capabilities) so iptables/tc work in a container started without
  NET_ADMIN. A daemon that cannot grant them (its own bounding set lacks one, e.g. inside another
  container) refuses such an exec before running anything; the transport then retries unprivileged and
  remembers that for the daemon (``exec_privileged`` says which), so the container's own capabilities apply.
* An exec process killed by a signal reads as ``-signum`` like :class:`subprocess.Popen`: the daemon
  reports ``128 + signum``, so an exit code of 129..192 is taken to mean that signal (shells do the same).
* A command is never run twice: the one retry (container re-found) happens only when the exec could not be
  created at all.
"""

from __future__ import annotations

import difflib
import io
import os
import tarfile
import threading
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from chaos.cluster.base import Completed, Transport, TransportError, kill_reported_group
from chaos.cluster.docker_exec import ExecConn, FrameReader, exit_code
from chaos.cluster.inventory import Host, Inventory
from chaos.cluster.remote_process import (
    CLOCK_LOOP,
    ClockEstimate,
    RemoteProcess,
    RemoteTransport,
    estimate_clock,
    remote_command,
    run_command,
)

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
_START_HINT = "start it with `bash scripts/start-dockerd.sh` (or point DOCKER_HOST / the host's docker_url at one)"
_REFUSED_CAPS = b"unable to apply caps"

# Daemon URL -> whether privileged execs work there (learned once per process, see the module docstring).
_PRIVILEGED: dict[str, bool] = {}
_PRIVILEGED_LOCK = threading.Lock()


class DockerProcess(RemoteProcess):
    """A process started by :meth:`DockerTransport.spawn`; behaves like the parts of Popen the harness uses."""

    _owner: DockerTransport

    def __init__(
        self,
        owner: DockerTransport,
        exec_id: str,
        conn: ExecConn,
        pid: int,
        argv: list[str],
        pending: bytes,
        watched: bool,
    ) -> None:
        super().__init__(owner, pid, argv, watched, FrameReader(conn, pending, self._at_eof))
        self._exec_id = exec_id
        self._conn = conn
        self._code: int | None = None
        self._eof = False

    def poll(self) -> int | None:
        """The exit code (``-signum`` if killed by a signal) or None while running; -1 when its fate is
        unknown (the daemon lost it: container removed or recreated, daemon unreachable)."""
        if self._code is not None:
            return self._code
        import docker.errors
        import requests

        try:
            info = self._owner.client.api.exec_inspect(self._exec_id)
        except docker.errors.NotFound:
            info = {"Running": False, "ExitCode": -1}
        except (docker.errors.DockerException, requests.RequestException, TransportError):
            info = {"Running": False, "ExitCode": -1}
        if info.get("Running") or info.get("ExitCode") is None:
            return None
        code = int(info["ExitCode"])
        self._code = -1 if code == -1 else exit_code(code)
        self._release_watcher()
        if self._eof:
            self._close()
        return self._code

    def _at_eof(self) -> None:
        # A watched process keeps its connection (its stdin) until its exit is seen: closing it earlier
        # would make the watcher signal a process that merely closed its output.
        self._eof = True
        if self.poll() is not None or not self._watched:
            self._close()

    def _close(self) -> None:
        self._owner._forget(self)
        self._conn.close()

    def _end_stdin(self, last: bytes) -> None:
        # The in-container watcher also checks that the pid is still its parent before signalling, so a
        # late EOF cannot hit a reused pid.
        try:
            self._conn.send(last)
            self._conn.shutdown_write()
        except OSError:
            pass


class DockerTransport(RemoteTransport[DockerProcess]):
    """Runs argv lists in one container, found by name on one Docker daemon. Connects lazily; thread-safe;
    ``close()`` when done (that also ends the stdin of every spawned process: ``kill_with_parent`` fires)."""

    # The spawn watcher checks that the command is still its parent before signalling: a reused pid is never hit.
    _guard_parent = True

    def __init__(self, host: Host, *, api_timeout: float = 60.0, clock_cache_s: float = 60.0) -> None:
        self.host = host.name
        self.spec = host
        # What names the container: a name, or a selector resolved on every lookup ("label:k=v[,k2=v2]", or
        # "service:NAME" / "service:PROJECT/NAME" for a compose service). container_name is the resolved name.
        self.selector = host.container or host.name
        self.container_name = self.selector
        self.api_timeout = api_timeout
        self.clock_cache_s = clock_cache_s
        self._client: docker.DockerClient | None = None
        self._container: Container | None = None
        self._lock = threading.Lock()
        self._processes: set[DockerProcess] = set()
        self._clock: tuple[float, ClockEstimate] | None = None

    @classmethod
    def for_host(cls, inventory: Inventory, name: str, **options: Any) -> DockerTransport:
        """The transport for inventory host ``name`` (which should say ``transport: docker``)."""
        return cls(inventory.host(name), **options)

    @property
    def docker_url(self) -> str:
        """The daemon this transport talks to, for messages."""
        return self.spec.docker_url or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET

    @property
    def exec_privileged(self) -> bool | None:
        """Whether execs on this daemon run privileged (None: not tried yet)."""
        with _PRIVILEGED_LOCK:
            return _PRIVILEGED.get(self.docker_url)

    def close(self) -> None:
        """Drop the API connection and every spawned process's stream. Safe to call twice."""
        with self._lock:
            client, self._client, self._container = self._client, None, None
            processes, self._processes = list(self._processes), set()
        for process in processes:
            process._conn.close()
        if client is not None:
            client.close()

    def _forget(self, process: DockerProcess) -> None:
        with self._lock:
            self._processes.discard(process)

    @property
    def client(self) -> docker.DockerClient:
        """The Engine API client, connected (and pinged) on first use; TransportError if the daemon is unreachable."""
        with self._lock:
            if self._client is not None:
                return self._client
            import docker
            import docker.errors
            import requests

            try:
                if self.spec.docker_url is None:
                    client = docker.from_env(timeout=int(self.api_timeout))
                else:
                    client = docker.DockerClient(base_url=self.spec.docker_url, timeout=int(self.api_timeout))
                client.ping()
            except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
                raise TransportError(
                    f"cannot reach the Docker daemon at {self.docker_url} for host {self.host}: {exc}; {_START_HINT}"
                ) from None
            self._client = client
            return client

    def container(self) -> Container:
        """The container named :attr:`container_name`, looked up afresh (so a recreated one is followed).

        TransportError when the daemon is unreachable, no such container exists (with a "did you mean"),
        or it is not running (with its state)."""
        import docker.errors
        import requests

        client = self.client
        try:
            filters = selector_filters(self.selector)
            if filters is None:
                found = client.containers.get(self.selector)
            else:
                matches = client.containers.list(all=True, filters={"label": filters})
                running = [c for c in matches if c.status == "running"] if len(matches) > 1 else matches
                if len(running) != 1:
                    names = ", ".join(sorted(c.name or str(c.id)[:12] for c in matches)) or "none"
                    raise TransportError(
                        f"container selector {self.selector!r} (host {self.host}) must match exactly one "
                        f"container on {self.docker_url}; it matches {len(matches)}: {names}"
                    )
                found = running[0]
                self.container_name = found.name or str(found.id)
        except docker.errors.NotFound:
            raise TransportError(
                f"no container named {self.container_name!r} (host {self.host}) on the Docker daemon at "
                f"{self.docker_url}{self._did_you_mean()}"
            ) from None
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise TransportError(
                f"cannot inspect container {self.container_name!r} at {self.docker_url}: {exc}"
            ) from None
        state = found.attrs.get("State") or {}
        if found.status != "running" or state.get("Paused") or state.get("Restarting"):
            detail = f"{found.status}" + (f", exit code {state.get('ExitCode')}" if found.status == "exited" else "")
            if state.get("Error"):
                detail += f", error: {state['Error']}"
            raise TransportError(
                f"container {self.container_name!r} (host {self.host}) is not running ({detail}); "
                f"start it (`docker start {self.container_name}`) or rebuild the testbed"
            )
        with self._lock:
            self._container = found
        return found

    def _did_you_mean(self) -> str:
        if selector_filters(self.selector) is not None:
            return ""
        try:
            names = [c.name for c in self.client.containers.list(all=True) if c.name]
        except Exception:  # only a hint: never mask the real error
            return ""
        close = difflib.get_close_matches(self.container_name, names, n=1, cutoff=0.6)
        if close:
            return f"; did you mean {close[0]!r}?"
        return f"; existing: {', '.join(sorted(names)[:10])}" if names else "; it has no containers"

    def _container_id(self) -> str:
        with self._lock:
            cached = self._container
        return cached.id if cached is not None and cached.id else str(self.container().id)

    def netns_inode(self) -> int | None:
        """The inode of the container's current network namespace (what ``ip netns identify``/``/proc/*/ns/net``
        compare), or None when it cannot be read. Read on this machine when the daemon is local, else inside."""
        container = self.container()
        pid = int((container.attrs.get("State") or {}).get("Pid") or 0)
        if pid > 0 and self.docker_url.startswith("unix://"):
            try:
                # Same pid namespace as the daemon only if that pid runs the container's own PID 1 command.
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
                if argv0 == str(container.attrs.get("Path", "")):
                    return os.stat(f"/proc/{pid}/ns/net").st_ino
            except OSError:
                pass
        done = self.run(["readlink", "/proc/1/ns/net"], timeout=15)
        text = done.stdout.strip()  # net:[4026532801]
        if done.ok and text.startswith("net:[") and text.endswith("]") and text[5:-1].isdigit():
            return int(text[5:-1])
        return None

    # --- exec plumbing ------------------------------------------------------------------------------------

    def _exec(self, command: str, argv: list[str], *, stdin: bool) -> tuple[str, ExecConn]:
        """Create and start ``sh -c command``; the container is re-found once if the exec could not be created,
        and an exec refused for its privileges is retried unprivileged (it never ran)."""
        import docker.errors
        import requests

        api = self.client.api
        for attempt in (1, 2, 3):
            # Learning is per exec: execs started at once while the daemon is unknown are each checked (one
            # thread's lesson must not let another's refused exec through as the command's own 126).
            learning = self.exec_privileged is None
            privileged = self.exec_privileged is not False
            try:
                created = api.exec_create(
                    self._container_id(),
                    ["sh", "-c", command],
                    stdin=stdin,
                    stdout=True,
                    stderr=True,
                    privileged=privileged,
                )
                exec_id = str(created["Id"])
                conn = ExecConn(api.exec_start(exec_id, socket=True))
            except docker.errors.NotFound:
                with self._lock:
                    self._container = None
                if attempt == 1:
                    continue
                self.container()  # raises the clear error (no such container / not running)
                raise TransportError(f"cannot start {argv[0]} in {self.container_name} ({self.host})") from None
            except docker.errors.APIError as exc:
                with self._lock:
                    self._container = None
                if exc.status_code == 409:  # "is not running", "is paused", "is restarting"
                    self.container()
                raise TransportError(f"cannot start {argv[0]} in {self.container_name} ({self.host}): {exc}") from None
            except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
                raise TransportError(f"cannot start {argv[0]} in {self.container_name} ({self.host}): {exc}") from None
            if privileged and learning:
                if self._refused_privileges(exec_id, conn):
                    continue
                with _PRIVILEGED_LOCK:
                    _PRIVILEGED.setdefault(self.docker_url, True)
            return exec_id, conn
        raise TransportError(f"cannot start {argv[0]} in {self.container_name} ({self.host})")

    def _refused_privileges(self, exec_id: str, conn: ExecConn) -> bool:
        """Whether this (first, privileged) exec was refused by the runtime for its capabilities; if so it is
        closed and the daemon remembered as unprivileged. Peeks at the first frame, which stays readable."""
        conn.settimeout(self.api_timeout)
        try:
            first = conn.frame()
        except OSError:
            return False
        finally:
            conn.settimeout(None)
        if first is not None:
            conn.unread(first)
        if first is not None and first[1].startswith(b"OCI runtime") and _REFUSED_CAPS in first[1]:
            conn.close()
            with _PRIVILEGED_LOCK:
                _PRIVILEGED[self.docker_url] = False
            return True
        return False

    def _exit_of(self, exec_id: str, deadline: float) -> int:
        """The exit code of a finished exec (the daemon may record it a moment after the stream ends)."""
        import docker.errors
        import requests

        pause = 0.005
        while True:
            try:
                info = self.client.api.exec_inspect(exec_id)
            except (docker.errors.DockerException, requests.RequestException) as exc:
                raise TransportError(
                    f"lost the exit code of an exec in {self.container_name} ({self.host}): {exc}"
                ) from None
            if not info.get("Running") and info.get("ExitCode") is not None:
                return exit_code(int(info["ExitCode"]))
            if time.monotonic() > deadline:
                return -1
            time.sleep(pause)
            pause = min(0.1, pause * 2)

    # --- Transport protocol -----------------------------------------------------------------------------

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        """Run ``argv`` in the container (stdin: /dev/null) and capture its output. On timeout its process
        group is SIGKILLed and TransportError raised; ``check`` raises TransportError on a non-zero exit."""
        command = run_command(argv)
        deadline = time.monotonic() + timeout
        exec_id, conn = self._exec(command, argv, stdin=False)
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            while True:
                conn.settimeout(max(0.001, deadline - time.monotonic()))
                try:
                    got = conn.frame()
                except TimeoutError:
                    kill_reported_group(self, b"".join(err))
                    raise TransportError(f"{argv[0]} timed out after {timeout:.0f}s on {self.host}") from None
                except OSError as exc:
                    raise TransportError(
                        f"connection to the Docker daemon lost while running {argv[0]} on {self.host}: {exc}"
                    ) from None
                if got is None:
                    break
                (out if got[0] == 1 else err).append(got[1])
        finally:
            conn.close()
        code = self._exit_of(exec_id, max(deadline, time.monotonic() + 5))
        stderr = b"".join(err).decode(errors="replace")
        first, _, rest = stderr.partition("\n")
        return self._completed(argv, code, b"".join(out), rest if first.strip().isdigit() else stderr, check)

    def _start(self, command: str, argv: list[str], watched: bool) -> DockerProcess:
        exec_id, conn = self._exec(command, argv, stdin=watched)
        first = b""
        pending = b""
        try:
            conn.settimeout(self.api_timeout)
            while b"\n" not in first:
                got = conn.frame()
                if got is None:
                    break
                if got[0] == 2:
                    first += got[1]
                else:
                    pending += got[1]
            conn.settimeout(None)
        except OSError as exc:
            conn.close()
            raise TransportError(f"cannot start {argv[0]} on {self.host}: {exc}") from None
        line, _, rest = first.partition(b"\n")
        if not line.strip().isdigit():
            conn.close()
            raise TransportError(f"cannot start {argv[0]} on {self.host}: no pid reported ({first!r})")
        process = DockerProcess(self, exec_id, conn, int(line), argv, pending + rest, watched)
        with self._lock:
            self._processes.add(process)
        return process

    def put(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path`` atomically: an archive to a temporary name in the same folder, then ``mv -f``."""
        import docker.errors
        import requests

        target = PurePosixPath(path)
        if not target.is_absolute():
            raise TransportError(f"put needs an absolute path in the container, not {path!r}")
        tmp_name = f".{target.name}.chaos-tmp-{uuid.uuid4().hex[:12]}"
        tmp = str(target.parent / tmp_name)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(tmp_name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        try:
            self.client.api.put_archive(self._container_id(), str(target.parent), buffer.getvalue())
        except docker.errors.NotFound as exc:
            self.container()  # the container itself missing says so; otherwise the folder is
            raise TransportError(
                f"cannot write {path} on {self.host}: {target.parent} does not exist ({exc})"
            ) from None
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise TransportError(f"cannot write {path} on {self.host}: {exc}") from None
        try:
            self.run(["mv", "-f", "--", tmp, str(target)], check=True)
        except TransportError:
            self.run(["rm", "-f", "--", tmp])
            raise

    def clock_estimate(self, samples: int = 9) -> ClockEstimate:
        """Measure the offset with ``samples`` round trips to one long-lived ``date +%s%N`` loop in the
        container (:func:`~chaos.cluster.remote_process.estimate_clock`)."""
        _exec_id, conn = self._exec("echo $$ >&2; " + remote_command(CLOCK_LOOP), CLOCK_LOOP, stdin=True)

        def ask() -> str:
            conn.send(b"\n")
            text = b""
            while not text.endswith(b"\n"):
                got = conn.frame()
                if got is None:
                    break
                if got[0] == 1:  # stderr holds only the shell's pid line
                    text += got[1]
            return text.decode(errors="replace")

        try:
            conn.settimeout(10.0)
            return estimate_clock(self.host, samples, ask)
        except OSError as exc:
            raise TransportError(f"cannot read the clock of {self.host}: {exc}") from None
        finally:
            conn.close()


def _satisfies_protocol(transport: DockerTransport) -> Transport:
    return transport  # never called: mypy proves here that DockerTransport is a Transport


def selector_filters(selector: str) -> list[str] | None:
    """Docker label filters for a container selector, or None for a plain container name.

    ``label:k=v[,k2=v2]`` -> every label must match; ``service:NAME`` -> the compose service NAME;
    ``service:PROJECT/NAME`` -> that service of that compose project. ValueError for an empty selector."""
    kind, sep, rest = selector.partition(":")
    if not sep or kind not in ("label", "service"):
        return None
    if not rest:
        raise ValueError(f"container selector {selector!r} names nothing after {kind}:")
    if kind == "label":
        return [part.strip() for part in rest.split(",") if part.strip()]
    project, slash, service = rest.rpartition("/")
    filters = [f"com.docker.compose.service={service}"]
    if slash:
        filters.append(f"com.docker.compose.project={project}")
    return filters
