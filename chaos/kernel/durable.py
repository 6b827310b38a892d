"""Making a write durable by path: the one ``fsync`` of a file's content or of a directory's entries.

Standard library only (the harness, the in-job agent and the checkpoint faults' host-side operations share it).
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path | str) -> None:
    """Make ``path`` durable: a file's content, or a directory's entries (a rename, link or unlink in it).
    OSError when it cannot be opened or synced."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
