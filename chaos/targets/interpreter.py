"""Which interpreter and launcher run the user's job, and what identifies them (and the job's code) for the
golden-run cache.

The interpreter (``python:`` on a ``torchrun`` or ``command`` target):

- given: that interpreter, a path or a name looked up on the job's ``PATH``, used as written;
- not given: the user's ``python3`` (the first on the job's ``PATH``) when it can import what the job needs,
  else mlchaos's own interpreter (``sys.executable``). What the job needs: ``torch`` for a torchrun target (the
  launcher is ``python -m torch.distributed.run``) or an entry script that imports it; ``chaos.agent`` for an
  entry that imports ``chaos`` (the agent line) or a ``chaos.*`` module; the top-level package of any other
  ``module:``. Why not always ``python3``: mlchaos is often installed in a venv that is not activated (``make
  demo`` runs ``.venv/bin/mlchaos``), and then ``python3`` is a system Python without torch or mlchaos; a job
  started with it could only crash. Why not always mlchaos's interpreter: a user who runs mlchaos from their
  own environment (activated venv, conda) expects their ``python3`` and its packages, which may differ from the
  ones mlchaos was installed with. The choice is made once per run on this host (a short probe, cached in the
  harness process) and shown in the target's description.

The launcher (``torchrun:`` on a ``torchrun`` target): given, that command (e.g. ``[/opt/venv/bin/torchrun]``);
it starts the workers with its own interpreter, unless ``python:`` is given too, in which case torchrun runs
``<python> <script>`` (``--no-python``). Not given: ``<python> -m torch.distributed.run``.

The golden cache (:func:`entry_files`, :func:`job_identity`): the job's entry script (a torchrun ``script:``, a
``module:``'s source, the ``.py`` files and the script program of a ``command``), and the interpreter's path,
Python version and torch version. A target's ``args`` and ``python:``/``torchrun:`` values are part of the
scenario's golden key already (the whole target spec is).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from chaos.spec.scenario import CommandTarget, TorchrunTarget

PYTHON_PLACEHOLDER = "{python}"
"""In a ``command`` target's argv: the job's interpreter (the target's ``python:``, else the default rule)."""

USER_PYTHON = "python3"
_PROBE_TIMEOUT_S = 60.0
_BARE_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")  # a command's program that names "the" interpreter
_IMPORTS = re.compile(r"^[ \t]*(?:import|from)[ \t]+(torch|chaos)\b", re.MULTILINE)
_MAX_SCRIPT_BYTES = 1 << 20  # a program file larger than this is a binary, not a script to fingerprint

# What a probe imports to tell whether an interpreter can run the job: the agent's module stands for mlchaos
# (it imports torch and pydantic, as the job will).
_AGENT = "chaos.agent"


@dataclass(frozen=True)
class Interpreter:
    """The interpreter chosen for a job: ``command`` is what goes into the argv; ``why`` says how it was chosen
    (for the target's description and the run log)."""

    command: str
    why: str


def _job_env(env: Mapping[str, str]) -> dict[str, str]:
    # The job runs with the harness's environment plus the target's env (SpawnedJob), so probes do too.
    return {**os.environ, **env}


def _which(program: str, env: Mapping[str, str]) -> str | None:
    return shutil.which(program, path=_job_env(env).get("PATH"))


def _same_environment(a: str, b: str) -> bool:
    # The same bin directory, compared WITHOUT resolving links: a venv's python is a link to its base
    # interpreter, and what makes it the venv's is the path it is started by (pyvenv.cfg beside it).
    return os.path.dirname(os.path.abspath(a)) == os.path.dirname(os.path.abspath(b))


def script_needs(path: Path | None) -> set[str]:
    """What a script imports of ``torch`` / ``chaos`` (read, never run), as the packages a probe must find."""
    if path is None:
        return set()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return set()
    found = set(_IMPORTS.findall(text))
    return {_AGENT if name == "chaos" else name for name in found}


@cache
def _probe_env(pythonpath: str | None) -> dict[str, str]:
    """This process's environment with PYTHONPATH set to ``pythonpath`` (removed when None): what the job's
    interpreter would see, so a probe finds what the job would find."""
    env = dict(os.environ)
    if pythonpath is None:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = pythonpath
    return env


def _can_import(python: str, needs: tuple[str, ...], pythonpath: str | None) -> bool:
    """Whether ``python`` finds every package in ``needs`` (located, not imported: importing torch takes
    seconds, and a located package is an installed one), importing only mlchaos's agent (its dependencies must
    be there too). Cached: one probe per interpreter and need per process."""
    code = (
        "import importlib, importlib.util, sys\n"
        "for name in sys.argv[1:]:\n"
        f"    if name == {_AGENT!r}:\n"
        "        importlib.import_module(name)\n"
        "    elif importlib.util.find_spec(name) is None:\n"
        "        sys.exit(1)\n"
    )
    env = _probe_env(pythonpath)
    try:
        done = subprocess.run(
            [python, "-c", code, *needs], env=env, capture_output=True, timeout=_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def resolve_python(explicit: str | None, *, needs: set[str], env: Mapping[str, str]) -> Interpreter:
    """The interpreter of a local job (see the module docstring for the rule)."""
    if explicit is not None:
        return Interpreter(explicit, "python: from the target")
    candidate = _which(USER_PYTHON, env)
    if candidate is None:
        return Interpreter(sys.executable, f"no {USER_PYTHON} on PATH: mlchaos's own interpreter")
    if _same_environment(candidate, sys.executable):
        return Interpreter(candidate, f"{USER_PYTHON} on PATH (the environment mlchaos runs in)")
    wanted = tuple(sorted(needs))
    if _can_import(candidate, wanted, _job_env(env).get("PYTHONPATH")):
        return Interpreter(candidate, f"{USER_PYTHON} on PATH")
    return Interpreter(
        sys.executable,
        f"{USER_PYTHON} on PATH ({candidate}) cannot import {', '.join(wanted) or 'what the job needs'}: "
        "mlchaos's own interpreter (set the target's python: to choose)",
    )


def _module_entry(module: str) -> Path | None:
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = found.origin if found is not None else None
    return Path(origin) if origin is not None and os.path.isfile(origin) else None


def torchrun_entry(spec: TorchrunTarget) -> Path | None:
    """The file a torchrun job starts from (its script, or its module's source as this harness finds it)."""
    if spec.module is not None:
        return _module_entry(spec.module)
    return Path(spec.script) if spec.script is not None and os.path.isfile(spec.script) else None


def _torchrun_needs(spec: TorchrunTarget) -> set[str]:
    needs = {"torch"} | script_needs(torchrun_entry(spec))
    if spec.module is not None:
        top = spec.module.split(".")[0]
        needs.add(_AGENT if top == "chaos" else top)
    return needs


def torchrun_python(spec: TorchrunTarget) -> Interpreter:
    """The interpreter of a one-host torchrun job: its workers' (and, without ``torchrun:``, the launcher's)."""
    return resolve_python(spec.python, needs=_torchrun_needs(spec), env=spec.env)


def torchrun_launcher(spec: TorchrunTarget, python: str) -> tuple[list[str], str | None]:
    """(the launcher's argv up to its options, the interpreter to put before the job or None).

    ``python`` is the job's interpreter (:func:`torchrun_python` here, the inventory's per host on a multi-node
    job). Without ``torchrun:``: ``[python, -m, torch.distributed.run]``, the workers inherit it. With it:
    ``torchrun`` as given; with ``python:`` too, ``--no-python`` and the job is started as ``<python> ...``."""
    if spec.torchrun is None:
        return [python, "-m", "torch.distributed.run"], None
    if spec.python is None:
        return list(spec.torchrun), None
    return [*spec.torchrun, "--no-python"], spec.python


TORCHRUN_LOG_DIR = "torchelastic"
"""Under the run directory: torchrun's own files (its workers' error files) for one run."""


def torchrun_log_dir(launcher: Sequence[str], run_dir: str) -> list[str]:
    """``--log-dir <run_dir>/torchelastic`` for a torchrun ``launcher`` (its argv up to its options): without it
    torchrun makes a ``/tmp/torchelastic_*`` directory at every launch and never removes it. Nothing when the
    launcher already sets a log directory (``torchrun:`` with ``--log-dir``)."""
    if any(arg.split("=", 1)[0] in ("--log-dir", "--log_dir") for arg in launcher):
        return []
    return ["--log-dir", f"{run_dir}/{TORCHRUN_LOG_DIR}"]


def torchrun_log_env(run_dir: str) -> dict[str, str]:
    """``PET_LOG_DIR`` for a job that may launch torchrun itself (a command or an sbatch script): torchrun reads
    its ``--log-dir`` default from it, so its files go under the run directory instead of a new
    ``/tmp/torchelastic_*`` that nobody removes. A ``--log-dir`` the job passes still wins."""
    return {"PET_LOG_DIR": f"{run_dir}/{TORCHRUN_LOG_DIR}"}


def command_argv(spec: CommandTarget, values: dict[str, str]) -> list[str]:
    """``spec.command`` with ``{python}`` expanded to the job's interpreter and, when the target names one
    (``python:``), a bare ``python``/``python3`` program replaced by it. Other placeholders are the caller's."""
    argv = list(spec.command)
    if spec.python is not None and _BARE_PYTHON.match(argv[0]):
        argv[0] = spec.python
    if any(PYTHON_PLACEHOLDER in part for part in argv):
        python = command_python(spec).command
        argv = [part.replace(PYTHON_PLACEHOLDER, python) for part in argv]
    return argv


def command_python(spec: CommandTarget) -> Interpreter:
    """The interpreter ``{python}`` stands for in a command target."""
    needs: set[str] = set()
    for path in command_scripts(spec):
        needs |= script_needs(path)
    return resolve_python(spec.python, needs=needs, env=spec.env)


def command_scripts(spec: CommandTarget) -> list[Path]:
    """The command's ``.py`` arguments that are files here, and ``-m`` modules' sources this harness finds."""
    found: list[Path] = []
    for index, part in enumerate(spec.command):
        if part.endswith(".py") and os.path.isfile(part):
            found.append(Path(part))
        elif part == "-m" and index + 1 < len(spec.command):
            entry = _module_entry(spec.command[index + 1])
            if entry is not None:
                found.append(entry)
    return found


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!" and os.path.getsize(path) <= _MAX_SCRIPT_BYTES
    except OSError:
        return False


def entry_files(spec: object) -> list[Path]:
    """The user's code files a job starts from, for the golden cache: a torchrun target's script (or module
    source); a command target's ``.py`` arguments, ``-m`` module sources, and its program when that is a script
    file (``#!``; a binary is identified by its path in :func:`job_identity` instead). Empty for other targets."""
    if isinstance(spec, TorchrunTarget):
        entry = torchrun_entry(spec)
        return [entry] if entry is not None else []
    if isinstance(spec, CommandTarget):
        files = command_scripts(spec)
        program = spec.command[0] if os.sep in spec.command[0] else _which(spec.command[0], spec.env)
        if program is not None and _is_script(program) and Path(program) not in files:
            files.insert(0, Path(program))
        return files
    return []


@cache
def _python_identity(python: str, pythonpath: str | None) -> str:
    """``python``'s own path and environment (``sys.prefix``: a venv's, not its base interpreter's), Python
    version and torch version (a cheap metadata read, no import of torch)."""
    code = (
        "import json, os, sys\n"
        "try:\n"
        "    from importlib.metadata import version\n"
        "    torch = version('torch')\n"
        "except Exception:\n"
        "    torch = None\n"
        "print(json.dumps([sys.executable, sys.prefix, sys.version.split()[0], torch]))\n"
    )
    env = _probe_env(pythonpath)
    try:
        done = subprocess.run(
            [python, "-c", code], env=env, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: not runnable ({type(exc).__name__})"
    if done.returncode != 0:
        return f"{python}: exit {done.returncode}"
    return done.stdout.strip()


def job_identity(spec: object) -> str:
    """What, besides the code files, decides what a job computes: its interpreter (path, environment, Python and
    torch versions) and its launcher. A text for the golden cache's fingerprint; empty for targets not run here as a
    command or torchrun job (the serving stack and HTTP endpoints)."""
    parts: list[str] = []
    if isinstance(spec, TorchrunTarget):
        if spec.nodes is not None:
            # The job runs with each host's own interpreter (the inventory's ``python``): not probed from here.
            parts.append(f"nodes python={spec.python} torchrun={spec.torchrun}")
        else:
            python = torchrun_python(spec).command
            launcher, _ = torchrun_launcher(spec, python)
            parts.append(_python_identity(python, _job_env(spec.env).get("PYTHONPATH")))
            if spec.torchrun is not None:
                program = spec.torchrun[0] if os.sep in spec.torchrun[0] else _which(spec.torchrun[0], spec.env)
                parts.append(f"launcher {os.path.realpath(program) if program else launcher[0]}")
                if program is not None and _is_script(program):
                    # A console script's first line names the interpreter its workers run with.
                    parts.append(Path(program).read_text(errors="replace").splitlines()[0])
    elif isinstance(spec, CommandTarget):
        program = spec.command[0] if os.sep in spec.command[0] else _which(spec.command[0], spec.env)
        parts.append(f"program {os.path.realpath(program) if program else spec.command[0]}")
        if spec.python is not None or any(PYTHON_PLACEHOLDER in part for part in spec.command):
            parts.append(_python_identity(command_python(spec).command, _job_env(spec.env).get("PYTHONPATH")))
        elif program is not None and _BARE_PYTHON.match(Path(spec.command[0]).name):
            parts.append(_python_identity(program, _job_env(spec.env).get("PYTHONPATH")))
    return json.dumps(parts)


def describe_python(interpreter: Interpreter) -> str:
    """A suffix for a target's description: which interpreter and why."""
    return f" with {interpreter.command} ({interpreter.why})"
