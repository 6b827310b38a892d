"""The SSH transport: one host of an inventory, through paramiko, behind the Transport protocol.

Contracts worth knowing:

* Commands are argv lists. :func:`remote_command` (shared with the Docker transport, from
  :mod:`chaos.cluster.remote_process`) is the ONE place that turns an argv into text for the remote shell
  (every word through ``shlex.quote``); the few shell fragments around it are constants.
  The login shell must be POSIX (sh, bash, dash, zsh).
* Host keys are verified against ``known_hosts``. An unknown host is refused unless ``accept_unknown``
  (then trusted for this transport's lifetime, with a warning); a CHANGED key is always refused, with a
  TransportError naming the host, the known_hosts file and the fix. Nothing is ever written to known_hosts.
* A remote process is the command itself (the shell ``exec``s it), so ``pid`` and signals reach the real
  process, and a death by signal reads as ``-signum`` like :class:`subprocess.Popen`.
* A dropped connection is re-opened once, but only before a command starts: a command is never run twice.
* ``run`` goes through ONE long-lived command channel per host (:mod:`chaos.cluster.command_channel`: a plain
  ``sh`` reading framed requests), opened at the first ``run`` and reused, so a command costs no new SSH session.
  A second concurrent ``run`` on the same host does not wait: it takes a session of its own. A channel found
  dead before a request, or one that took not a byte of it, is re-opened and the request sent there (it never
  ran); one that dies with a request (or part of one) in flight is a TransportError, never a retry. On the channel a death by
  signal reads as ``128 + signum`` and the reply comes when the command exits (a detached child's later output
  is not waited for); ``command_channel=False`` gives one session per command (``-signum``, output to EOF).
"""

from __future__ import annotations

import io
import signal
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST

from chaos.cluster import command_channel as cmdchan
from chaos.cluster.base import Completed, Transport, TransportError, kill_reported_group
from chaos.cluster.inventory import Host, Inventory
from chaos.cluster.remote_process import (
    CLOCK_LOOP,
    RemoteProcess,
    RemoteTransport,
    estimate_clock,
    run_command,
)
from chaos.cluster.remote_process import ClockEstimate as ClockEstimate  # re-exported: imported from here
from chaos.cluster.remote_process import remote_command as remote_command  # re-exported: imported from here

_DRAIN_INTERVAL_S = 0.05
_KEEPALIVE_S = 15


class UnknownHostKeyWarning(UserWarning):
    """A host absent from known_hosts was trusted because ``accept_unknown`` is on."""


class _ChannelReader(io.RawIOBase):
    """A channel's stdout as a raw byte stream, so it can be wrapped into a real ``IO[bytes]``."""

    def __init__(self, channel: paramiko.Channel) -> None:
        super().__init__()
        self._channel = channel

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._channel.recv(len(buffer))  # blocks until data or EOF (b"")
        buffer[: len(data)] = data
        return len(data)


class SshProcess(RemoteProcess):
    """A process started by :meth:`SshTransport.spawn`; behaves like the parts of Popen the harness uses."""

    def __init__(
        self, owner: SshTransport, channel: paramiko.Channel, pid: int, argv: list[str], watched: bool
    ) -> None:
        super().__init__(owner, pid, argv, watched, _ChannelReader(channel))
        self._channel = channel

    def poll(self) -> int | None:
        """The exit code (``-signum`` if killed by a signal) or None while running.

        -1 when the connection was lost before the exit was reported: the process's fate is then unknown
        (with ``kill_with_parent`` it has been sent that signal)."""
        if not self._channel.exit_status_ready():
            return None
        self._release_watcher()
        return self._channel.recv_exit_status()

    def _await_exit(self, timeout: float | None) -> bool:
        return self._channel.status_event.wait(timeout)

    def _end_stdin(self, last: bytes) -> None:
        try:
            self._channel.sendall(last)
            self._channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def _install_exit_signal_handler(transport: paramiko.Transport) -> None:
    """Make a death by signal read as ``-signum`` instead of paramiko's bare -1.

    sshd reports it with an ``exit-signal`` channel request that paramiko ignores; this wraps paramiko's
    (private, per-class) channel-request handler on this one transport. Without that table (a future
    paramiko), nothing changes and such deaths read as -1.
    """
    table = getattr(type(transport), "_channel_handler_table", None)
    if not isinstance(table, dict) or MSG_CHANNEL_REQUEST not in table:
        return
    original: Callable[[paramiko.Channel, paramiko.Message], None] = table[MSG_CHANNEL_REQUEST]

    def handle(channel: paramiko.Channel, message: paramiko.Message) -> None:
        start = message.packet.tell()
        if message.get_text() == "exit-signal":
            message.get_boolean()  # want_reply: always false for exit-signal (RFC 4254 6.10)
            name = message.get_text()
            try:
                channel.exit_status = -int(signal.Signals["SIG" + name])
            except KeyError:
                channel.exit_status = -1
            channel.status_event.set()
            return
        message.packet.seek(start)
        original(channel, message)

    transport._channel_handler_table = {**table, MSG_CHANNEL_REQUEST: handle}  # type: ignore[attr-defined]


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown host: refuse with a clear error, or (accept_unknown) trust it for this transport and warn."""

    def __init__(self, owner: SshTransport) -> None:
        self._owner = owner

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        owner = self._owner
        if not owner.accept_unknown:
            raise TransportError(
                f"host {owner.host} ({hostname}) is not in {owner.known_hosts_label}; its key is {_fingerprint(key)}. "
                f"Verify that fingerprint out of band, then add the key (e.g. `ssh-keyscan -p {owner.spec.port} "
                f"{owner.spec.address} >> {owner.known_hosts_label}`), or set accept_unknown_host_keys: true "
                "to trust first-seen hosts"
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        owner._accepted[(hostname, key.get_name())] = key
        warnings.warn(
            f"trusting unknown host key of {owner.host} ({hostname}): {_fingerprint(key)}",
            UnknownHostKeyWarning,
            stacklevel=2,
        )


class SshTransport(RemoteTransport[SshProcess]):
    """Runs argv lists on one inventory host over SSH. Connects lazily; thread-safe; ``close()`` when done."""

    def __init__(
        self,
        host: Host,
        *,
        known_hosts: Path | None = None,
        accept_unknown: bool = False,
        connect_timeout: float = 10.0,
        clock_cache_s: float = 60.0,
        command_channel: bool = True,
    ) -> None:
        self.host = host.name
        self.command_channel = command_channel
        self.spec = host
        self.known_hosts = known_hosts
        self.accept_unknown = accept_unknown
        self.connect_timeout = connect_timeout
        self.clock_cache_s = clock_cache_s
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._accepted: dict[tuple[str, str], paramiko.PKey] = {}
        self._clock: tuple[float, ClockEstimate] | None = None
        self._channel: cmdchan.CommandChannel | None = None
        self._channel_lock = threading.Lock()  # one request in flight on the command channel

    @classmethod
    def for_host(cls, inventory: Inventory, name: str, **options: Any) -> SshTransport:
        """The transport for inventory host ``name``, with the inventory's host-key settings."""
        return cls(
            inventory.host(name),
            known_hosts=inventory.known_hosts,
            accept_unknown=inventory.accept_unknown_host_keys,
            **options,
        )

    @property
    def known_hosts_label(self) -> str:
        return str(self.known_hosts) if self.known_hosts is not None else "~/.ssh/known_hosts"

    def close(self) -> None:
        """Close the command channel (its shell on the host exits) and the connection; a later call reconnects."""
        with self._lock:
            client, self._client = self._client, None
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
        if client is not None:
            client.close()

    @property
    def channel_pid(self) -> int | None:
        """The pid of the command channel's shell on the host, once it reported it (None without one)."""
        channel = self._channel
        return channel.pid if channel is not None else None

    # --- connection -------------------------------------------------------------------------------------

    def connect(self) -> paramiko.Transport:
        """The live paramiko transport, connecting (and verifying the host key) if needed."""
        with self._lock:
            if self._client is not None:
                live = self._client.get_transport()
                if live is not None and live.is_active():
                    return live
                self._client.close()
                self._client = None
            client = self._new_client()
            self._client = client
            live = client.get_transport()
            assert live is not None
            return live

    def _new_client(self) -> paramiko.SSHClient:
        spec = self.spec
        client = paramiko.SSHClient()
        try:
            if self.known_hosts is not None:
                client.load_host_keys(str(self.known_hosts))
            else:
                client.load_system_host_keys()
        except OSError as exc:
            raise TransportError(f"cannot read known_hosts {self.known_hosts_label} for {self.host}: {exc}") from exc
        for (name, kind), key in self._accepted.items():
            client.get_host_keys().add(name, kind, key)
        client.set_missing_host_key_policy(_HostKeyPolicy(self))
        where = f"{spec.user}@{spec.address}:{spec.port}"
        try:
            sock = socket.create_connection((spec.address, spec.port), timeout=self.connect_timeout)
            # Without NODELAY every channel open waits out a delayed ACK (~40 ms): 10x slower commands.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise TransportError(f"cannot connect to {self.host} ({where}): {exc}") from None
        try:
            client.connect(
                spec.address,
                port=spec.port,
                username=spec.user,
                key_filename=str(spec.key_file) if spec.key_file is not None else None,
                allow_agent=spec.key_file is None,
                look_for_keys=spec.key_file is None,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                sock=sock,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            pattern = spec.address if spec.port == 22 else f"[{spec.address}]:{spec.port}"
            raise TransportError(
                f"HOST KEY MISMATCH for {self.host} ({spec.address}:{spec.port}): it presented "
                f"{_fingerprint(exc.key)} but {self.known_hosts_label} expects {_fingerprint(exc.expected_key)}. "
                "Someone may be intercepting the connection, or the host was rebuilt. Refusing to connect. "
                f"If the change is legitimate, remove the old entry with `ssh-keygen -R '{pattern}' -f "
                f"{self.known_hosts_label}` and add the new key after checking its fingerprint "
                "(for an mlchaos testbed, `mlchaos testbed up` rewrites its known_hosts)"
            ) from None
        except TransportError:
            client.close()
            raise
        except paramiko.AuthenticationException as exc:
            client.close()
            how = f"key {spec.key_file}" if spec.key_file is not None else "the SSH agent and default keys"
            raise TransportError(f"authentication failed for {self.host} ({where}) with {how}: {exc}") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            raise TransportError(f"cannot connect to {self.host} ({where}): {exc}") from None
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(_KEEPALIVE_S)  # so a dead peer is noticed, not waited on forever
        _install_exit_signal_handler(transport)
        return client

    def _open_channel(self) -> paramiko.Channel:
        """A new session channel; a dropped connection is re-opened once (nothing has run yet)."""
        for attempt in (1, 2):
            transport = self.connect()
            try:
                return transport.open_session(timeout=self.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self.close()
                if attempt == 2:
                    raise TransportError(f"cannot open a session on {self.host}: {exc}") from None
        raise AssertionError("unreachable")

    # --- Transport protocol -----------------------------------------------------------------------------

    def run(self, argv: list[str], *, timeout: float = 30.0, check: bool = False) -> Completed:
        """Run ``argv`` (stdin: /dev/null) and capture its output. On timeout the remote process group is
        SIGKILLed and TransportError raised; ``check`` raises TransportError on a non-zero exit.

        Through the host's command channel when there is one free (see the module's contracts), else in a
        session of its own."""
        if self.command_channel and self._channel_lock.acquire(blocking=False):
            try:
                code, out, err = self._run_on_channel(argv, timeout)
            finally:
                self._channel_lock.release()
            return self._completed(argv, code, out, err.decode(errors="replace"), check)
        return self._run_in_session(argv, timeout=timeout, check=check)

    def _run_on_channel(self, argv: list[str], timeout: float) -> tuple[int, bytes, bytes]:
        """``argv`` on the command channel (caller holds ``_channel_lock``). A request not one byte of which left
        (:class:`~chaos.cluster.command_channel.NotSent`) is sent once more on a new channel; any
        other failure drops the channel (a timed-out one with its process group) and raises TransportError."""
        text = remote_command(argv, self.spec.sudo)
        for attempt in (1, 2):
            channel = self._live_channel()
            try:
                return channel.run(text, timeout)
            except cmdchan.NotSent as exc:
                self._drop_channel(channel)
                if attempt == 2:
                    raise TransportError(f"cannot run {argv[0]} on {self.host}: {exc}") from None
            except cmdchan.TimedOut as exc:
                self._drop_channel(channel)
                if exc.pid is not None:
                    kill_reported_group(self, str(exc.pid).encode())  # the shell and its command; another session
                raise TransportError(f"{argv[0]} timed out after {timeout:.0f}s on {self.host}") from None
            except cmdchan.Lost as exc:
                self._drop_channel(channel)
                raise TransportError(f"connection to {self.host} lost while running {argv[0]}: {exc}") from None
        raise AssertionError("unreachable")

    def _live_channel(self) -> cmdchan.CommandChannel:
        """The command channel, (re)opened when missing or dead (nothing is in flight on it: the caller holds
        ``_channel_lock``); a dropped connection is re-opened once, as for any session."""
        for attempt in (1, 2):
            transport = self.connect()
            channel = self._channel
            if channel is not None and channel.usable(transport):
                return channel
            if channel is not None:
                self._drop_channel(channel)
            try:
                fresh = cmdchan.CommandChannel.open(transport, self.host, self.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self.close()
                if attempt == 2:
                    raise TransportError(f"cannot open the command channel on {self.host}: {exc}") from None
                continue
            with self._lock:
                self._channel = fresh
            return fresh
        raise AssertionError("unreachable")

    def _drop_channel(self, channel: cmdchan.CommandChannel) -> None:
        with self._lock:
            if self._channel is channel:
                self._channel = None
        channel.close()

    def _run_in_session(self, argv: list[str], *, timeout: float, check: bool) -> Completed:
        """``argv`` in a session of its own: what ``run`` did before the command channel."""
        command = run_command(argv, self.spec.sudo)
        channel = self._open_channel()
        out: list[bytes] = []
        err: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            channel.exec_command(command)
            while not channel.status_event.wait(_DRAIN_INTERVAL_S):
                self._drain(channel, out, err)  # keep the windows open so a chatty command cannot stall
                if time.monotonic() > deadline:
                    kill_reported_group(self, b"".join(err))
                    raise TransportError(f"{argv[0]} timed out after {timeout:.0f}s on {self.host}")
            channel.settimeout(max(0.1, deadline - time.monotonic()))
            for chunk in iter(lambda: channel.recv(65536), b""):
                out.append(chunk)
            for chunk in iter(lambda: channel.recv_stderr(65536), b""):
                err.append(chunk)
            code = channel.recv_exit_status()
            if code == -1 and not channel.get_transport().is_active():
                # Closed without an exit status: the connection died, the command's fate is unknown.
                raise TransportError(f"connection to {self.host} lost while running {argv[0]}")
        except TimeoutError:
            raise TransportError(f"{argv[0]} on {self.host}: output still open {timeout:.0f}s after exit") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"connection to {self.host} failed while running {argv[0]}: {exc}") from None
        finally:
            channel.close()
        _pid, _, stderr = b"".join(err).decode(errors="replace").partition("\n")
        return self._completed(argv, code, b"".join(out), stderr, check)

    @staticmethod
    def _drain(channel: paramiko.Channel, out: list[bytes], err: list[bytes]) -> None:
        while channel.recv_ready():
            out.append(channel.recv(65536))
        while channel.recv_stderr_ready():
            err.append(channel.recv_stderr(65536))

    def _sudo(self) -> bool:
        return self.spec.sudo

    def _start(self, command: str, argv: list[str], watched: bool) -> SshProcess:
        channel = self._open_channel()
        try:
            channel.exec_command(command)
            channel.settimeout(self.connect_timeout)
            first = b""
            while not first.endswith(b"\n"):
                byte = channel.recv_stderr(1)
                if not byte:
                    break
                first += byte
            channel.settimeout(None)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            channel.close()
            raise TransportError(f"cannot start {argv[0]} on {self.host}: {exc}") from None
        if not first.strip().isdigit():
            channel.close()
            raise TransportError(f"cannot start {argv[0]} on {self.host}: no pid reported ({first!r})")
        return SshProcess(self, channel, int(first), argv, watched=watched)

    def put(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path`` atomically: SFTP to a temporary name in the same folder, then rename.

        With ``sudo`` hosts the file goes to /tmp first and is moved into place by ``sudo``.
        """
        target = PurePosixPath(path)
        staging = PurePosixPath("/tmp") if self.spec.sudo else target.parent
        tmp = str(staging / f".{target.name}.chaos-tmp-{uuid.uuid4().hex[:12]}")
        sftp = self._open_sftp()
        try:
            with sftp:
                try:
                    sftp.putfo(io.BytesIO(data), tmp)
                    if not self.spec.sudo:
                        sftp.posix_rename(tmp, str(target))
                except (OSError, paramiko.SSHException) as exc:
                    try:
                        sftp.remove(tmp)
                    except OSError:
                        pass
                    raise TransportError(f"cannot write {path} on {self.host}: {exc}") from None
        except EOFError as exc:
            raise TransportError(f"connection to {self.host} lost while writing {path}: {exc}") from None
        if self.spec.sudo:
            # cp then mv within the target folder keeps the final step an atomic rename.
            near = str(target.parent / PurePosixPath(tmp).name)
            try:
                self.run(["cp", "--", tmp, near], check=True)
                self.run(["mv", "-f", "--", near, str(target)], check=True)
            finally:
                self.run(["rm", "-f", "--", tmp, near])

    def _open_sftp(self) -> paramiko.SFTPClient:
        """An SFTP session; a dropped connection is re-opened once (nothing has been written yet)."""
        for attempt in (1, 2):
            transport = self.connect()
            try:
                sftp = paramiko.SFTPClient.from_transport(transport)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self.close()
                if attempt == 2:
                    raise TransportError(f"cannot open SFTP on {self.host}: {exc}") from None
                continue
            if sftp is not None:
                return sftp
        raise TransportError(f"cannot open SFTP on {self.host}")

    def clock_estimate(self, samples: int = 9) -> ClockEstimate:
        """Measure the offset with ``samples`` round trips to one long-lived ``date +%s%N`` loop on the host
        (:func:`~chaos.cluster.remote_process.estimate_clock`). One channel for all samples keeps session
        set-up out of the brackets."""
        channel = self._open_channel()
        try:
            channel.exec_command(remote_command(CLOCK_LOOP, self.spec.sudo))
            channel.settimeout(10.0)
            replies = channel.makefile("rb")

            def ask() -> str:
                channel.sendall(b"\n")
                line: bytes = replies.readline()
                return line.decode(errors="replace")

            return estimate_clock(self.host, samples, ask)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"cannot read the clock of {self.host}: {exc}") from None
        finally:
            channel.close()


def _satisfies_protocol(transport: SshTransport) -> Transport:
    return transport  # never called: mypy proves here that SshTransport is a Transport


T = TypeVar("T", bound=Transport)
R = TypeVar("R")


class FanOutError(TransportError):
    """Some calls of :func:`fan_out` failed; ``failures`` maps host to its exception, ``results`` the rest."""

    def __init__(self, failures: dict[str, BaseException], results: dict[str, object]) -> None:
        self.failures = failures
        self.results = results
        lines = "; ".join(f"{host}: {type(exc).__name__}: {exc}" for host, exc in failures.items())
        super().__init__(f"{len(failures)} of {len(failures) + len(results)} hosts failed: {lines}")


def fan_out(transports: Sequence[T], fn: Callable[[T], R], max_parallel: int = 8) -> list[R]:
    """``fn(t)`` for every transport, at most ``max_parallel`` at once; results in the order given.

    Every call runs to completion even when others fail (no half-finished fan-out); then FanOutError
    names each failed host.
    """
    if not transports:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(transports)))) as pool:
        futures = [pool.submit(fn, t) for t in transports]
    failures: dict[str, BaseException] = {}
    results: dict[str, object] = {}
    ordered: list[R] = []
    for transport, future in zip(transports, futures, strict=True):
        exc = future.exception()
        if exc is not None:
            failures[transport.host] = exc
        else:
            value = future.result()
            results[transport.host] = value
            ordered.append(value)
    if failures:
        raise FanOutError(failures, results)
    return ordered
