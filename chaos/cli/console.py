"""The CLI's two rich consoles, one definition for every ``mlchaos`` subcommand module, and the width of
``--help``.

On a terminal rich sizes output to the window. Elsewhere (CI logs, cron mail, a pipe) rich would assume 80
columns and wrap wide tables such as ``mlchaos history`` into unreadable cells, so a fixed width is used
there instead, unless ``COLUMNS`` says otherwise. ``--help`` follows the same rule.
"""

from __future__ import annotations

import os
import sys

import typer.rich_utils as typer_rich_utils
from rich.console import Console

PLAIN_WIDTH = 160  # wide enough for the widest table (mlchaos history) without wrapping


def plain_width() -> int | None:
    """None (let rich ask the terminal, or read ``COLUMNS``) on a terminal or with ``COLUMNS`` set; else
    ``PLAIN_WIDTH``."""
    return None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PLAIN_WIDTH


def stdout_console() -> Console:
    """Standard output: the terminal's width, else ``COLUMNS``, else ``PLAIN_WIDTH``."""
    return Console(highlight=False, soft_wrap=True, width=plain_width())


def widen_help() -> None:
    """Make typer's ``--help`` (a rich console of its own) follow :func:`plain_width` instead of cutting option
    descriptions into 80 columns in a pipe or CI log. ``TERMINAL_WIDTH``, typer's own setting, still wins."""
    if os.environ.get("TERMINAL_WIDTH"):
        return
    # typer reads this module global each time it renders help; it is what ``TERMINAL_WIDTH`` sets.
    typer_rich_utils.MAX_WIDTH = plain_width()


def stderr_console() -> Console:
    """Standard error, for problems and refusals."""
    return Console(stderr=True, highlight=False, soft_wrap=True)
