"""iptables plumbing for the network faults: dedicated, tagged chains that heal removes exactly and completely.

Discipline (the same for partition, packet_loss, drop_large_packets and flap):

* Every op gets its own chains, ``CHAOS-<10 hex>-in`` (jumped to from INPUT) and ``CHAOS-<10 hex>-out``
  (from OUTPUT). The hex is a hash of op id, host and time, so a rerun of the same op id never shares a chain
  with a crashed run's leftovers. Two chains rather than one: a ``-s CIDR`` rule reached from OUTPUT would
  drop our own outgoing traffic whenever the CIDR contains this host.
* Our DROP rules live only inside those chains. The built-in chains get one jump each, inserted at the top
  (so another tool's earlier ACCEPT cannot shadow the fault) and tagged ``-m comment --comment mlchaos:<op>``.
* :func:`remove` deletes every rule anywhere in the filter table that jumps to one of our chains (every
  copy, whatever its spec), then flushes and deletes the chains. It needs only the chain names, so it works
  from a journal after a crash, and running it again is a no-op.

Only the ``iptables`` binary is used, never ``iptables-nft``/``iptables-legacy`` by name: whichever backend
the host's ``iptables`` selects, apply and heal talk to the same one. Commands go through a ``Run`` callable
(a transport's ``run`` for the harness, a local runner for the host-side flap helper).

Batching: one fault is dozens of rules, and every ``iptables`` call is a process (and, remotely, an SSH
round trip). Where ``iptables-restore`` reports the SAME backend as ``iptables`` (:func:`restore_backend`),
:func:`install` loads the whole op as ONE ``iptables-restore --noflush`` transaction (:func:`install_text`) and
:func:`uninstall` removes it with one more (:func:`uninstall_text`). Both are atomic, so a failed batch
changes nothing, and then the one-command-at-a-time path runs as before (it covers a retried apply, extra
copies of a jump, a host without ``iptables-restore``). The dead-man's revert stays plain ``iptables`` calls.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import JsonValue

from chaos.cluster.base import Completed, TransportError
from chaos.plugins.injector import InjectionError

Run = Callable[[list[str]], Completed]
Put = Callable[[bytes, str], None]  # a transport's ``put``: write bytes to a path on the host
Restore = Callable[[str], bool]  # load an iptables-restore text (filter table); True when it committed

CHAIN_PREFIX = "CHAOS-"
HOOKS = {"in": "INPUT", "out": "OUTPUT"}
_CHAIN = re.compile(r"^CHAOS-[0-9a-f]{10}-(in|out)$")
_COMMENT_SAFE = re.compile(r"[^A-Za-z0-9_.:@+=-]")
_BYPASS_COMMENT = "mlchaos-flap-up"
_WAIT = ["-w", "5"]  # wait for the legacy xtables lock instead of failing when another tool holds it
_MAX_ROUNDS = 8
RESTORE = "iptables-restore"
_RESTORE_BARE = re.compile(r"^[A-Za-z0-9_.:/,@+=!%-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_FILE_TAG = re.compile(r"[^A-Za-z0-9_.-]")


def iptables(*args: str) -> list[str]:
    """The argv of one ``iptables`` call (filter table) that waits for the xtables lock."""
    return ["iptables", *_WAIT, *args]


def chain_names(op_id: str, host: str, directions: Iterable[str]) -> dict[str, str]:
    """Fresh chain names for ``directions`` (``in``/``out``) of one op: ``{"in": "CHAOS-<hex>-in", ...}``.

    Names are ours (never built from user text) and at most 20 characters (iptables allows 28).
    """
    digest = hashlib.sha256(f"{op_id}\0{host}\0{time.time_ns()}".encode()).hexdigest()[:10]
    return {direction: f"{CHAIN_PREFIX}{digest}-{direction}" for direction in directions}


def checked_chain(name: object) -> str:
    """``name`` if it is one of our chain names; InjectionError otherwise (a corrupt or foreign journal)."""
    if not isinstance(name, str) or not _CHAIN.match(name):
        raise InjectionError(f"{name!r} is not an mlchaos chain name (CHAOS-<10 hex>-in|out); refusing to touch it")
    return name


def comment_for(op_id: str) -> str:
    """The ``mlchaos:<op id>`` tag on our jumps, with odd characters replaced (it is shown, never parsed)."""
    return "mlchaos:" + _COMMENT_SAFE.sub("_", op_id)[:200]


@dataclass(frozen=True)
class ChainSpec:
    """One chain of an op: its name, the built-in chain that jumps to it, and its rules (argv fragments)."""

    chain: str
    hook: str
    rules: list[list[str]] = field(default_factory=list)

    def to_json(self) -> dict[str, JsonValue]:
        rules: list[JsonValue] = [list(rule) for rule in self.rules]
        return {"chain": self.chain, "hook": self.hook, "rules": rules}

    @classmethod
    def from_json(cls, value: JsonValue) -> ChainSpec:
        """Parse (and validate) one journaled chain; InjectionError when it is not what we write."""
        if not isinstance(value, dict):
            raise InjectionError(f"journal chain entry is not an object: {value!r}")
        hook, rules = value.get("hook"), value.get("rules", [])
        if hook not in HOOKS.values() or not isinstance(hook, str):
            raise InjectionError(f"journal chain hook {hook!r} is not INPUT or OUTPUT")
        if not isinstance(rules, list) or not all(
            isinstance(rule, list) and all(isinstance(part, str) for part in rule) for rule in rules
        ):
            raise InjectionError("journal chain rules are not lists of strings")
        parsed = [[part for part in rule if isinstance(part, str)] for rule in rules if isinstance(rule, list)]
        return cls(checked_chain(value.get("chain")), hook, parsed)


def chains_from_state(state: dict[str, JsonValue]) -> list[ChainSpec]:
    """The chains recorded in an Applied.state (key ``chains``)."""
    raw = state.get("chains")
    if not isinstance(raw, list):
        raise InjectionError(f"journal state has no chain list: {raw!r}")
    return [ChainSpec.from_json(item) for item in raw]


def drop_rules(
    direction: str,
    peers: Sequence[str],
    protocol: str,
    ports: Sequence[int],
    extra: Sequence[str],
    *,
    port_match: str = "--ports",
    target: Sequence[str] = ("-j", "DROP"),
) -> list[list[str]]:
    """DROP (or ``target``) rules for one direction: per peer (``-s`` in, ``-d`` out), per protocol, with
    ``extra`` matches.

    ``ports`` match either end (``multiport --ports``), so a partition of a service port also cuts the
    replies (``port_match="--dports"``: the destination only); with protocol ``all`` and ports, both tcp and
    udp rules are written (multiport needs one).
    """
    flag = "-s" if direction == "in" else "-d"
    if ports:
        protocols = ["tcp", "udp"] if protocol == "all" else [protocol]
    else:
        protocols = [] if protocol == "all" else [protocol]
    matches = ["-m", "multiport", port_match, ",".join(str(port) for port in ports)] if ports else []
    rules = []
    for peer in peers:
        if not protocols:
            rules.append([flag, peer, *extra, *target])
        for proto in protocols:
            rules.append([flag, peer, "-p", proto, *matches, *extra, *target])
    return rules


def _call(run: Run, argv: list[str]) -> Completed:
    try:
        return run(argv)
    except TransportError as exc:
        raise InjectionError(f"cannot run {' '.join(argv[:4])}: {exc}") from exc


def _must(run: Run, argv: list[str]) -> Completed:
    done = _call(run, argv)
    if not done.ok:
        raise InjectionError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()[:300]}")
    return done


def backend(run: Run) -> str:
    """``nf_tables`` or ``legacy`` (from ``iptables -V``); InjectionError when iptables cannot run."""
    text = _must(run, ["iptables", "-V"]).stdout
    match = re.search(r"\((\w+)\)", text)
    return match.group(1) if match else "legacy"  # versions before 1.8 print no backend and are legacy-only


def restore_backend(run: Run) -> str | None:
    """The backend ``iptables-restore`` talks to (as :func:`backend`), or None when it cannot run here.

    Batching is used only when this equals :func:`backend`: rules loaded through one backend are invisible
    to (and so never healed by) an ``iptables`` that talks to the other.
    """
    try:
        done = run([RESTORE, "-V"])
    except TransportError:
        return None
    if not done.ok:
        return None
    match = re.search(r"\((\w+)\)", done.stdout + done.stderr)
    return match.group(1) if match else "legacy"


def _listing(run: Run) -> tuple[set[str], list[list[str]]]:
    """(user chains, ``-A`` rules as argv tokens) of the filter table, from ``iptables -S``."""
    done = _must(run, iptables("-S"))
    chains, rules = set(), []
    for line in done.stdout.splitlines():
        if line.startswith("-N "):
            chains.add(line[3:].strip())
        elif line.startswith("-A "):  # other lines: policies, and the nft backend's "# Warning: ..." notes
            try:
                rules.append(shlex.split(line))
            except ValueError:  # unbalanced quoting cannot come from iptables itself; keep what we can use
                rules.append(line.split())
    return chains, rules


def _jump_target(tokens: Sequence[str]) -> str | None:
    for index, token in enumerate(tokens[:-1]):
        if token in ("-j", "-g", "--jump", "--goto"):
            return tokens[index + 1]
    return None


def restore_word(word: str) -> str:
    """``word`` as one token of an iptables-restore line: bare when plain, else double-quoted with ``\\`` and
    ``"`` escaped (the quoting ``iptables-save`` writes). InjectionError for control characters, which could
    end the line and start another command."""
    if _CONTROL.search(word):
        raise InjectionError(f"{word!r} cannot be written into an iptables-restore line")
    if _RESTORE_BARE.match(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _restore_lines(commands: Sequence[Sequence[str]]) -> str:
    body = "".join(" ".join(restore_word(word) for word in command) + "\n" for command in commands)
    return f"*filter\n{body}COMMIT\n"


def _jump(spec: ChainSpec, comment: str) -> list[str]:
    return ["-m", "comment", "--comment", comment, "-j", spec.chain]


def install_text(specs: Sequence[ChainSpec], comment: str, *, bypass: bool = False) -> str:
    """The ``iptables-restore --noflush`` text of :func:`install` for chains that do not exist yet.

    ``-N`` (not a ``:chain`` line, which would silently flush an existing chain) makes the whole batch fail
    when a chain is already there, so a retried apply falls back to the command-by-command path, which adds
    no second jump. InjectionError when a chain name or rule word cannot be written safely.
    """
    commands: list[list[str]] = []
    for spec in specs:
        chain = checked_chain(spec.chain)
        commands.append(["-N", chain])
        if bypass:
            commands.append(["-A", chain, "-m", "comment", "--comment", _BYPASS_COMMENT, "-j", "RETURN"])
        commands += [["-A", chain, *rule] for rule in spec.rules]
    commands += [["-I", spec.hook, "1", *_jump(spec, comment)] for spec in specs]
    return _restore_lines(commands)


def uninstall_text(specs: Sequence[ChainSpec], comment: str) -> str:
    """The ``iptables-restore --noflush`` text that undoes exactly what :func:`install` added.

    It deletes the one jump per chain, then flushes and deletes the chains. Committing it proves the heal
    complete: a chain that any other rule still jumps to cannot be deleted, so an extra copy of a jump (or a
    missing one) fails the whole batch, changing nothing, and :func:`remove` takes over.
    """
    commands = [["-D", spec.hook, *_jump(spec, comment)] for spec in specs]
    for spec in specs:
        chain = checked_chain(spec.chain)
        commands += [["-F", chain], ["-X", chain]]
    return _restore_lines(commands)


def restore_argv() -> list[str]:
    """``iptables-restore`` that waits for the xtables lock and adds to (never flushes) the filter table,
    reading the batch from stdin."""
    return [RESTORE, *_WAIT, "--noflush"]


def file_restore(run: Run, put: Put, tag: str) -> Restore:
    """A :data:`Restore` for hosts reached through a transport without stdin: ``put`` the text to a fresh
    ``/tmp/mlchaos-iptables-<tag>-<random>.rules``, run ``iptables-restore -w 5 --noflush FILE``, and always
    remove the file. It answers False (never raises) when any step fails; the caller then falls back."""
    safe = _FILE_TAG.sub("_", tag)[:60]

    def restore(text: str) -> bool:
        path = f"/tmp/mlchaos-iptables-{safe}-{secrets.token_hex(6)}.rules"
        try:
            put(text.encode(), path)
            return run([RESTORE, *_WAIT, "--noflush", path]).ok
        except (TransportError, OSError):
            return False
        finally:
            try:
                run(["rm", "-f", "--", path])
            except TransportError:
                pass  # an unreachable host: the file holds only our rule text, nothing in force

    return restore


def install(
    run: Run, specs: Sequence[ChainSpec], comment: str, *, bypass: bool = False, restore: Restore | None = None
) -> None:
    """Create each chain (or flush it if a retried apply left it), fill it, then jump to it from its hook.

    With ``bypass`` each chain starts with a RETURN so the fault is installed but not yet in force (the
    flap helper toggles it). Jumps are added only when missing, so a repeated install adds no copies.
    With ``restore`` (see :func:`restore_backend`) it is first tried as one atomic batch (:func:`install_text`);
    when that fails, nothing was changed and the commands below run one by one.
    Raises InjectionError on the first failing command (the caller heals with :func:`remove`).
    """
    if restore is not None:
        try:
            text: str | None = install_text(specs, comment, bypass=bypass)
        except InjectionError:
            text = None  # the command path reports the bad name/word precisely
        if text is not None and restore(text):
            return
    for spec in specs:
        chain = checked_chain(spec.chain)
        if not _call(run, iptables("-N", chain)).ok:
            _must(run, iptables("-F", chain))  # it exists: a retried apply of this very op
        if bypass:
            _must(run, iptables("-A", chain, "-m", "comment", "--comment", _BYPASS_COMMENT, "-j", "RETURN"))
        for rule in spec.rules:
            _must(run, iptables("-A", chain, *rule))
    for spec in specs:
        jump = _jump(spec, comment)
        if not _call(run, iptables("-C", spec.hook, *jump)).ok:
            _must(run, iptables("-I", spec.hook, "1", *jump))


def set_bypass(run: Run, chains: Sequence[str], *, up: bool) -> None:
    """Flap toggle: ``up`` puts a RETURN at the top of each chain (traffic flows), else removes every copy."""
    for chain in chains:
        rule = ["-m", "comment", "--comment", _BYPASS_COMMENT, "-j", "RETURN"]
        present = _call(run, iptables("-C", chain, *rule)).ok
        if up and not present:
            _must(run, iptables("-I", chain, "1", *rule))
        elif not up:
            for _ in range(_MAX_ROUNDS):
                if not _call(run, iptables("-D", chain, *rule)).ok:
                    break


def remove(run: Run, chains: Sequence[str]) -> None:
    """Delete every rule that jumps to ``chains`` (all copies, any spec), then flush and delete the chains.

    Idempotent; works from the names alone. Raises InjectionError when something of ours is still there
    after a bounded number of rounds (e.g. another process keeps re-adding a jump).
    """
    names = {checked_chain(chain) for chain in chains}
    for _ in range(_MAX_ROUNDS):
        present, rules = _listing(run)
        ours = names & present
        jumps = [rule for rule in rules if _jump_target(rule) in names and rule[1] not in names]
        if not jumps and not ours:
            return
        for rule in jumps:
            _call(run, iptables("-D", *rule[1:]))  # a failure is judged by the next listing
        if not jumps:  # -X refuses a chain that is still referenced, so only once the jumps are gone
            for chain in sorted(ours):
                _call(run, iptables("-F", chain))
                _call(run, iptables("-X", chain))
    left = sorted(names & _listing(run)[0])
    raise InjectionError(f"iptables chains {', '.join(left) or sorted(names)} could not be removed")


def uninstall(run: Run, specs: Sequence[ChainSpec], comment: str | None, *, restore: Restore | None = None) -> None:
    """Heal one op: with ``restore`` and the op's ``comment``, first the one-batch :func:`uninstall_text`; when
    that is not possible or does not commit, :func:`remove` (every jump, every copy). Idempotent."""
    if restore is not None and comment is not None:
        try:
            text: str | None = uninstall_text(specs, comment)
        except InjectionError:
            text = None
        if text is not None and restore(text):
            return
    remove(run, [spec.chain for spec in specs])


def leftovers(run: Run) -> list[str]:
    """Every ``CHAOS-`` chain and every rule tagged ``mlchaos`` on the host (for checks and cleanup)."""
    present, rules = _listing(run)
    found = sorted(chain for chain in present if chain.startswith(CHAIN_PREFIX))
    found += [" ".join(rule) for rule in rules if any("mlchaos" in token for token in rule)]
    return found


def probe(run: Run, matches: Sequence[str], target: Sequence[str] = ("-j", "DROP")) -> str | None:
    """Why iptables with ``matches`` (plus the comment match) cannot be used here, or None when it can.

    ``iptables -C`` asks whether such a rule exists without changing anything, yet it must load every match
    module and take the same privileges as a change. Usable means exit 0, or exit 1 with "Bad rule (does a
    matching rule exist ...)": other exit-1 answers ("No chain/target/match", an nft-incompatible table) are not.
    """
    argv = iptables("-C", "OUTPUT", "-m", "comment", "--comment", "mlchaos-probe", *matches, *target)
    try:
        done = run(argv)
    except TransportError as exc:
        return f"cannot run iptables: {exc}"
    said_all = done.stderr + done.stdout
    if done.returncode == 0 or (done.returncode == 1 and "does a matching rule exist" in said_all):
        return None
    said = (done.stderr or done.stdout).strip()
    return said.splitlines()[0] if said else f"iptables -C exited {done.returncode}"


# The dead-man's revert, as one argv with no Python needed on the host. The script text is a CONSTANT: the
# only data it sees are chain names passed as positional parameters ("$@"), which sh never parses as code and
# which are quoted at every use; on top of that they are checked against ^CHAOS-[0-9a-f]{10}-(in|out)$ before
# the argv is built. It deletes, by line number, the first rule in INPUT/OUTPUT/FORWARD whose target is our
# chain until none is left (a bounded loop, so a tool re-adding it cannot keep us here forever), then flushes
# and deletes the chain. Line numbers instead of specs because re-reading a spec would need `eval` of
# `iptables -S` text (comments can hold anything). Exit 0 only when no chain of ours is left.
REVERT_SCRIPT = """\
rc=0
for chain in "$@"; do
  for hook in INPUT OUTPUT FORWARD; do
    i=0
    while [ "$i" -lt 64 ]; do
      n=$(iptables -w 5 -n -L "$hook" --line-numbers 2>/dev/null | while read -r num target rest; do
            if [ "$target" = "$chain" ]; then echo "$num"; break; fi
          done)
      [ -n "$n" ] || break
      iptables -w 5 -D "$hook" "$n" || { rc=1; break; }
      i=$((i + 1))
    done
  done
  if iptables -w 5 -n -L "$chain" >/dev/null 2>&1; then
    { iptables -w 5 -F "$chain" && iptables -w 5 -X "$chain"; } || rc=1
  fi
done
exit "$rc"
"""


def revert_argv(chains: Sequence[str], *, sudo: bool) -> list[str]:
    """``sh -c REVERT_SCRIPT mlchaos-netrevert CHAIN...`` (behind ``sudo -n`` when the op needed it)."""
    names = [checked_chain(chain) for chain in chains]
    return [*(["sudo", "-n"] if sudo else []), "sh", "-c", REVERT_SCRIPT, "mlchaos-netrevert", *names]
