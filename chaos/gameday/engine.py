"""The game day engine: what a fault may touch (blast radius), the live state folded from the run's history,
operator input, and one run driven from a worker thread so the main thread keeps the keyboard and signals.

Contracts:
- :func:`blast_radius` changes nothing: it resolves hosts the way the runner will (same seed, same op ids)
  and describes the processes each fault selects; a host that cannot be resolved is reported, not raised
  (the runner refuses such a run before anything is applied).
- :class:`GameState` is a pure fold over :class:`~chaos.history.timeline.Event` s (testable on hand-made events).
- :class:`GameDay` never leaves a fault applied: every way out (``abort``, Ctrl-C, SIGTERM/SIGHUP, the run's
  own end) goes through :func:`chaos.run.orchestrator.execute`, which heals in ``finally``; :meth:`GameDay.on_signal`
  only counts signals (it takes no lock, so it cannot deadlock the thread it interrupts).
- Everything the operator types goes into the history: commands as ``runner.operator`` (written by the
  runner), notes as ``runner.note``, anything else (help, unknown words, Ctrl-C) as a ``runner.note`` whose
  text starts with ``typed:``. Lines typed after the run loop ended cannot be recorded; they are refused.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import BaseModel, ValidationError

from chaos.cluster.hosts import LOCAL, HostsError, HostSet
from chaos.event_kinds import (
    FAULT_APPLIED,
    FAULT_FAILED,
    FAULT_HEALED,
    LOAD_REQUEST,
    RUNNER_END,
    RUNNER_ERROR,
    RUNNER_INTERRUPTED,
    RUNNER_NOTE,
    RUNNER_OPERATOR,
    RUNNER_REFUSED,
    RUNNER_START,
    TARGET_START,
    TARGET_STEP,
)
from chaos.event_kinds import SERVING_REPLICA_START as REPLICA_START
from chaos.history.timeline import Event, EventFileTail
from chaos.kernel.procfs import lineage
from chaos.plan.build import Plan
from chaos.run.control import Command, RunControl
from chaos.run.orchestrator import RunOptions, execute
from chaos.run.result import RunResult, RunStatus
from chaos.spec.scenario import CommandTarget, FaultSpec, Scenario, TorchrunTarget

TYPED_PREFIX = "typed: "
# Too frequent to be worth a line in "recent events"; they feed the step and request-rate fields instead.
QUIET_KINDS = (LOAD_REQUEST, TARGET_STEP, "target.log*")
HELP = "i: inject the next fault now · h: heal all now · n TEXT: note · a [WHY]: abort (heal, end) · ?: help"


# -- operator input -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Typed:
    """One line the operator typed, parsed. ``command`` None: help or not a command (recorded as a note)."""

    line: str
    command: Command | None
    text: str = ""
    help: bool = False


_WORDS: dict[str, Command] = {
    "i": "inject_next",
    "inject": "inject_next",
    "h": "heal_all",
    "heal": "heal_all",
    "n": "note",
    "note": "note",
    "a": "abort",
    "abort": "abort",
}


def parse_command(line: str) -> Typed:
    """``i``/``inject``, ``h``/``heal``, ``n``/``note`` TEXT, ``a``/``abort`` [WHY], ``?``/``help``; anything
    else (including a note without text) is ``Typed(command=None)``."""
    stripped = line.strip()
    word, _, rest = stripped.partition(" ")
    rest = rest.strip()
    if word.lower() in ("?", "help"):
        return Typed(line, None, help=True)
    command = _WORDS.get(word.lower())
    if command is None or (command == "note" and not rest) or (command in ("inject_next", "heal_all") and rest):
        return Typed(line, None)
    return Typed(line, command, rest)


class LineEditor:
    """Keystrokes to lines for a terminal in cbreak mode, where the terminal does not echo: the live view
    shows :attr:`buffer` instead. Handles Enter (CR or LF), Backspace, Ctrl-U, Ctrl-W; drops escape
    sequences (arrow keys) and other control characters."""

    def __init__(self) -> None:
        self.buffer = ""
        self._escape = ""  # "" none, "esc" after ESC, "csi" inside ESC [ ..., "ss3" after ESC O

    def feed(self, text: str) -> list[str]:
        """Add typed characters; return the lines they completed."""
        lines = []
        for char in text:
            if self._escape == "esc":
                self._escape = "csi" if char == "[" else "ss3" if char == "O" else ""
            elif self._escape == "csi":
                self._escape = "" if "@" <= char <= "~" else "csi"
            elif self._escape == "ss3":
                self._escape = ""
            elif char == "\x1b":
                self._escape = "esc"
            elif char in "\r\n":
                lines.append(self.buffer)
                self.buffer = ""
            elif char in "\x7f\b":
                self.buffer = self.buffer[:-1]
            elif char == "\x15":
                self.buffer = ""
            elif char == "\x17":
                self.buffer = self.buffer.rstrip()
                self.buffer = self.buffer[: self.buffer.rfind(" ") + 1]
            elif char.isprintable():
                self.buffer += char
        return lines


@contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """The terminal on ``fd`` without line buffering and echo (signals such as Ctrl-C still work), restored
    on exit whatever happens."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


# -- blast radius -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reach:
    """What one fault of the scenario may touch: its ops, hosts and processes, and warnings."""

    fault: str
    injector: str
    ops: list[str]
    duration_s: float | None
    hosts: list[str]
    touches: str
    warnings: list[str] = field(default_factory=list)


def host_label(name: str) -> str:
    return f"this machine ({socket.gethostname()})" if name == LOCAL else name


def _selects(params: BaseModel) -> str:
    """The processes (or other objects) a fault's params select, in words."""
    for key, words in (
        ("rank", "rank {}"),
        ("pid", "pid {}"),
        ("replica", "replica {}"),
        ("name", "processes matching /{}/"),
    ):
        value = getattr(params, key, None)
        if value is not None:
            return words.format(value)
    shown = params.model_dump(mode="json", exclude_defaults=True)
    return ", ".join(f"{k}={v}" for k, v in shown.items()) or "(no parameters)"


def _local_matches(pattern: str) -> list[str]:
    """``pid (command)`` of the processes on this machine whose command line matches ``pattern`` now,
    other than this process and its ancestors (the process injectors never touch those)."""
    regex = re.compile(pattern)
    ancestors = lineage(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in ancestors:
            continue
        try:
            args = " ".join(Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1])
        except OSError:
            continue
        if args and regex.search(args):
            found.append(f"{entry} ({args[:60]})")
    return found


# Targets whose process selectors (name:) match only the target's own process tree (ProcessTreeResolver); an
# http target is someone else's service, so its name: selectors match across the host.
SCOPED_TARGETS = frozenset({"torchrun", "roles", "command", "serving"})


def _reach_of(fault: FaultSpec, plan: Plan, hosts: HostSet, scoped: bool) -> Reach:
    ops = [op for op in plan.ops if op.fault == fault.name]
    warnings: list[str] = []
    names: list[str] = []
    if fault.hosts is not None and fault.hosts.rank is not None:
        names = [f"the host of rank {fault.hosts.rank} when it fires"]
    else:
        for op in ops:
            try:
                names += [n for n in hosts.resolve(fault, op.op_id, plan.seed) if n not in names]
            except HostsError as exc:
                warnings.append(f"cannot resolve hosts: {exc}")
                break
    touches = _selects(fault.params)
    pattern = getattr(fault.params, "name", None)
    if isinstance(pattern, str) and scoped:
        touches = f"the target's own processes matching /{pattern}/ (never a process outside its tree)"
    elif isinstance(pattern, str) and names == [LOCAL]:
        already = _local_matches(pattern)
        if already:
            warnings.append(
                f"/{pattern}/ already matches {len(already)} running process(es) besides the target: "
                + ", ".join(already[:3])
                + (" …" if len(already) > 3 else "")
            )
    return Reach(fault.name, fault.type, [op.op_id for op in ops], fault.duration, names, touches, warnings)


def blast_radius(scenario: Scenario, plan: Plan, hosts: HostSet) -> list[Reach]:
    """What each fault of ``scenario`` may touch under ``plan`` (see the module contract)."""
    scoped = getattr(scenario.target, "type", None) in SCOPED_TARGETS
    return [_reach_of(fault, plan, hosts, scoped) for fault in scenario.faults]


def target_reach(scenario: Scenario, hosts: HostSet, seed: int) -> str:
    """Where the target runs and which ranks or replicas it has, in words."""
    spec = scenario.target
    if isinstance(spec, TorchrunTarget):
        where = host_label(LOCAL)
        nodes = 1
        if spec.nodes is not None:
            try:
                chosen = hosts.job_nodes(spec.nodes, seed)
                nodes, where = len(chosen), ", ".join(name for name, _ in chosen)
            except HostsError as exc:
                where = f"inventory hosts ({exc})"
        ranks = spec.nproc_per_node * nodes
        return (
            f"torchrun {spec.module or spec.script}: ranks 0..{ranks - 1} ({spec.nproc_per_node} per node) on {where}"
        )
    if isinstance(spec, CommandTarget):
        return f"command `{' '.join(spec.command)}` (and its children) on {host_label(LOCAL)}"
    if spec.type == "serving":
        replicas = ["primary"] + (["fallback"] if getattr(spec, "fallback", None) is not None else [])
        return f"serving stack on {host_label(LOCAL)}: replicas {', '.join(replicas)} behind a gateway"
    return f"http endpoint {getattr(spec, 'url', '?')} (already running; faults reach it only through hosts)"


def safety_lines(scenario: Scenario) -> list[str]:
    s = scenario.safety
    lines = [
        f"max_duration {s.max_duration:g}s; no_progress_timeout "
        + (f"{s.no_progress_timeout:g}s" if s.no_progress_timeout is not None else "never"),
        f"blast_radius (most faults active at once): {s.blast_radius if s.blast_radius is not None else 'no limit'}",
        f"heal_grace {s.heal_grace:g}s: a fault with a duration is reverted by a dead-man switch even if mlchaos dies",
    ]
    if s.abort_on:
        lines.append(f"abort_on: {', '.join(s.abort_on)}")
    if scenario.cluster.protected:
        lines.append(f"protected hosts: {', '.join(scenario.cluster.protected)}")
    return lines


# -- live state ---------------------------------------------------------------------------------------------------


@dataclass
class FaultView:
    op: str
    host: str
    applied_ns: int
    duration_s: float | None
    description: str


@dataclass
class Worker:
    """A rank (pid, host, attempt) or a serving replica (pid, port)."""

    pid: int | None
    host: str
    detail: str = ""


class GameState:
    """The live view's model, folded from history events in arrival order (see :meth:`observe`)."""

    def __init__(self, recent: int = 10, window_s: float = 5.0) -> None:
        self.started_ns: int | None = None
        self.step: int | None = None
        self.fired = 0
        self.healed = 0
        self.failed = 0
        self.applied: dict[str, FaultView] = {}  # by op id (+ "@host" off this machine); healed ones removed
        self.ranks: dict[int, Worker] = {}
        self.replicas: dict[str, Worker] = {}
        self.hosts: set[str] = {LOCAL}
        self.recent: deque[Event] = deque(maxlen=recent)
        self.ended: str | None = None
        self.window_ns = int(window_s * 1e9)
        self._requests: deque[tuple[int, bool]] = deque()

    def observe(self, event: Event) -> None:
        kind, data = event.kind, event.data
        if kind == RUNNER_START:
            self.started_ns = event.ts_ns
        elif kind in (RUNNER_END, RUNNER_INTERRUPTED, RUNNER_REFUSED, RUNNER_ERROR):
            self.ended = self.ended or kind
        elif kind == TARGET_STEP:
            step = event.get_int("step")
            if step is not None:
                self.step = step if self.step is None else max(self.step, step)
        elif kind == FAULT_APPLIED:
            self.fired += 1
            host = event.get_str("host") or LOCAL
            self.hosts.add(host)
            op = event.get_str("op") or "?"
            duration = data.get("duration_s")
            self.applied[op if host == LOCAL else f"{op}@{host}"] = FaultView(
                op,
                host,
                event.ts_ns,
                float(duration) if isinstance(duration, int | float) else None,
                event.get_str("description") or "",
            )
        elif kind == FAULT_HEALED:
            self.healed += 1
            op, where = event.get_str("op") or "?", event.get_str("host")
            for key in [k for k, v in self.applied.items() if v.op == op and (where is None or v.host == where)]:
                del self.applied[key]
        elif kind == FAULT_FAILED:
            self.failed += 1
        elif kind == TARGET_START and event.rank is not None:
            host = event.get_str("host") or LOCAL
            self.hosts.add(host)
            attempt = event.get_int("attempt")
            self.ranks[event.rank] = Worker(event.get_int("pid"), host, f"attempt {attempt}" if attempt else "")
        elif kind == REPLICA_START:
            port = event.get_int("port")
            self.replicas[event.get_str("replica") or "?"] = Worker(
                event.get_int("pid"), LOCAL, f"port {port}" if port else ""
            )
        elif kind == LOAD_REQUEST:
            status = data.get("status")
            ok = "error" not in data and isinstance(status, int) and 200 <= status < 400
            self._requests.append((event.ts_ns, not ok))
        if not any(event.matches(quiet) for quiet in QUIET_KINDS):
            self.recent.append(event)

    def request_rate(self, now_ns: int) -> tuple[float, float] | None:
        """(requests/s, error fraction) over the last window, or None before any request."""
        while self._requests and self._requests[0][0] < now_ns - self.window_ns:
            self._requests.popleft()
        if not self._requests:
            return None
        errors = sum(1 for _, bad in self._requests if bad)
        return len(self._requests) / (self.window_ns / 1e9), errors / len(self._requests)


def describe_event(event: Event, started_ns: int | None) -> tuple[str, str, str]:
    """(``+seconds``, kind, short detail) of one event, for the recent-events table."""
    at = f"+{(event.ts_ns - started_ns) / 1e9:.1f}s" if started_ns is not None else ""
    data = event.data
    if event.kind == RUNNER_NOTE:
        detail = f"{data.get('author') or '?'}: {data.get('text')}"
    elif event.kind == RUNNER_OPERATOR:
        detail = f"{data.get('author') or '?'}: {data.get('command')} {data.get('text') or ''}".rstrip()
    elif event.kind.startswith("fault."):
        detail = f"{data.get('op')} {data.get('description') or data.get('error') or ''}".rstrip()
    else:
        detail = " ".join(f"{k}={v}" for k, v in data.items())
    if event.rank is not None:
        detail = f"rank {event.rank} {detail}"
    return at, event.kind, detail[:100]


# -- following the run's history ----------------------------------------------------------------------------------


def find_run_dir(root: Path, scenario: str, before: set[Path], pid: int) -> Path | None:
    """The run folder :func:`~chaos.run.orchestrator.execute` created for ``scenario`` in this process (``pid``) under
    ``root`` since ``before`` (the folders that existed when the game day started), or None yet."""
    for candidate in sorted(root.glob(f"{scenario}-*")):
        if candidate in before:
            continue
        try:
            with open(candidate / "history.jsonl", "rb") as handle:
                first = Event.model_validate_json(handle.readline())
        except (OSError, ValidationError):
            continue
        if first.kind == RUNNER_START and first.get_int("pid") == pid and first.get_str("scenario") == scenario:
            return candidate
    return None


# -- the session --------------------------------------------------------------------------------------------------


class GameDay:
    """One game day run: :meth:`start` runs :func:`~chaos.run.orchestrator.execute` in a worker thread with a
    :class:`~chaos.run.control.RunControl`; the caller's thread calls :meth:`service` a few times a second (to
    follow the history and act on signals) and :meth:`submit` for every typed line (from any thread).

    Ctrl-C (and SIGTERM/SIGHUP, through :meth:`on_signal`) records a ``typed: Ctrl-C`` note, then interrupts
    the run loop from inside its own status callback, at a poll, never mid-apply: the runner heals in
    ``finally`` and ends the run as ``interrupted`` (no checks, no golden run), as ``mlchaos run`` does on
    Ctrl-C. Before the loop polls (the target is not ready yet) it is an abort through the control instead.
    Later signals change nothing: healing is never skipped.
    """

    FALLBACK_S = 1.0  # how long a signal waits for the run loop's poll before it becomes an abort

    def __init__(self, scenario: Scenario, options: RunOptions, author: str) -> None:
        self.scenario = scenario
        self.author = author
        self.control = RunControl()
        self.options = replace(options, control=self.control)
        self.state = GameState()
        self.status: RunStatus | None = None
        self.result: RunResult | None = None
        self.crash: BaseException | None = None
        self.run_dir: Path | None = None
        self.logs: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.wake = threading.Event()  # set by the input side so the view redraws at once
        self.signals = 0  # written only by on_signal (the main thread): no lock needed or allowed
        self.last_signum = 0
        self.first_signal_ns: int | None = None
        self._signals_seen = 0
        self._armed_at: int | None = None  # status polls counted when the interrupt was armed
        self._armed_t = 0.0
        self._aborted_by_signal = False
        self._polls = 0
        self._tail: EventFileTail | None = None
        self._before = set(options.report_root.glob(f"{scenario.name}-*"))
        self._thread = threading.Thread(target=self._work, name="mlchaos-gameday-run")

    # -- worker side
    def _work(self) -> None:
        try:
            self.result = execute(self.scenario, self.options, log=self.logs.put, status=self._on_status)
        except BaseException as exc:  # a harness bug after healing (reports): shown, exit 3
            self.crash = exc

    def _on_status(self, status: RunStatus) -> None:
        """Called by the run loop every poll (worker thread). Raising here is how a signal ends the run: the
        runner's ``except KeyboardInterrupt`` path heals in ``finally`` and records ``runner.interrupted``."""
        self.status = status
        self._polls += 1
        armed = self._armed_at
        # Two polls after arming, so that loop iteration's drain has written the "typed: Ctrl-C" note.
        if armed is not None and self._polls >= armed + 2:
            self._armed_at = None
            raise KeyboardInterrupt(f"{self._signal_word()} from {self.author}")

    # -- caller side
    def start(self, note: str = "") -> None:
        """Start the run; ``note`` (e.g. who confirmed the plan) becomes its first ``runner.note``."""
        if note:
            self.control.note(note, self.author)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def on_signal(self, signum: int, _frame: object = None) -> None:
        """Signal handler (main thread). Only counts: the work happens in :meth:`service`."""
        self.signals += 1
        self.last_signum = signum
        if self.first_signal_ns is None:
            self.first_signal_ns = time.time_ns()

    def _signal_word(self) -> str:
        if self.last_signum in (0, signal.SIGINT):
            return "Ctrl-C"
        return signal.Signals(self.last_signum).name

    def service(self) -> list[str]:
        """Follow the history and act on new signals; returns lines to show the operator."""
        said: list[str] = []
        if self.signals > self._signals_seen:
            first = self._signals_seen == 0
            self._signals_seen = self.signals
            if first and self.running and self.state.ended is None:
                self.control.note(
                    f"{TYPED_PREFIX}{self._signal_word()} (interrupt: heal everything and end)", self.author
                )
                self._armed_at, self._armed_t = self._polls, time.monotonic()
                said.append(f"{self._signal_word()}: healing every active fault, then ending the run …")
            elif first:
                said.append("the run has already ended: healing, checks and reports finish first …")
            elif self.running:
                said.append(
                    "still healing and finishing: faults are healed before exit (Ctrl-\\ quits at once, leaving "
                    "faults to their dead-man switches and `mlchaos cleanup`)"
                )
        if (
            self._armed_at is not None
            and not self._aborted_by_signal
            and self._polls == self._armed_at
            and time.monotonic() - self._armed_t > self.FALLBACK_S
            and self.running
        ):
            self._aborted_by_signal = True  # the loop is not polling (starting up): end it through the control
            self.control.abort(f"interrupted ({self._signal_word()})", self.author)
        if self.run_dir is None:
            self.run_dir = find_run_dir(self.options.report_root, self.scenario.name, self._before, os.getpid())
            if self.run_dir is not None:
                self._tail = EventFileTail(self.run_dir / "history.jsonl")  # keeps each line's own source
        if self._tail is not None:
            for event in self._tail.poll():
                self.state.observe(event)
        while True:
            try:
                said.append(self.logs.get_nowait())
            except queue.Empty:
                break
        return said

    @property
    def interrupted(self) -> bool:
        return self.signals > 0

    def submit(self, line: str) -> str:
        """Carry out one typed line (any thread); returns what to tell the operator."""
        typed = parse_command(line)
        if not typed.line.strip():
            return ""
        if not self.running or self.state.ended is not None:
            return f"the run has ended; {typed.line.strip()!r} was not recorded"
        if typed.command == "inject_next":
            self.control.inject_next(self.author)
            return "injecting the next planned fault now"
        if typed.command == "heal_all":
            self.control.heal_all(self.author)
            return "healing every active fault now"
        if typed.command == "note":
            self.control.note(typed.text, self.author)
            return f"note recorded: {typed.text}"
        if typed.command == "abort":
            self.control.abort(typed.text, self.author)  # empty: the runner says "aborted by the operator"
            return "aborting: healing every active fault, then ending the run"
        self.control.note(TYPED_PREFIX + typed.line.strip(), self.author)
        if typed.help:
            return HELP
        return f"unknown command {typed.line.strip()!r} (recorded as a note); ? for help"

    def healed_since_signal(self) -> int:
        """fault.healed events at or after the first signal (what an interrupt healed)."""
        if self.result is None or self.first_signal_ns is None:
            return 0
        return sum(1 for e in self.result.history.of(FAULT_HEALED) if e.ts_ns >= self.first_signal_ns)
