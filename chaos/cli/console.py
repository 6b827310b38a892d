"""The CLI's two rich consoles, one definition for every ``mlchaos`` subcommand module.

On a terminal rich sizes output to the window. Elsewhere (CI logs, cron mail, a pipe) rich would assume 80
columns and wrap wide tables such as ``mlchaos history`` into unreadable cells, so a fixed width is used
there instead, unless ``COLUMNS`` says otherwise.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

PLAIN_WIDTH = 160  # wide enough for the widest table (mlchaos history) without wrapping


def stdout_console() -> Console:
    """Standard output: the terminal's width, else ``COLUMNS``, else ``PLAIN_WIDTH``."""
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PLAIN_WIDTH
    return Console(highlight=False, soft_wrap=True, width=width)


def stderr_console() -> Console:
    """Standard error, for problems and refusals."""
    return Console(stderr=True, highlight=False, soft_wrap=True)
