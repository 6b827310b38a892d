"""The folder where mlchaos keeps state that must outlive a run (journals, helper state, testbed records).

A leaf module on purpose: injectors, testbeds and the journal all need this one folder, and nothing else of
each other.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """Where mlchaos keeps state: ``$MLCHAOS_STATE_DIR``, else /var/lib/mlchaos as root, else ~/.local/state."""
    explicit = os.environ.get("MLCHAOS_STATE_DIR")
    if explicit:
        return Path(explicit)
    if os.geteuid() == 0:
        return Path("/var/lib/mlchaos")
    return Path.home() / ".local" / "state" / "mlchaos"
