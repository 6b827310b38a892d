"""Suite-wide fixtures: every test's journals live in a temporary state directory, never /var/lib/mlchaos."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("mlchaos-state")
    previous = os.environ.get("MLCHAOS_STATE_DIR")
    os.environ["MLCHAOS_STATE_DIR"] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop("MLCHAOS_STATE_DIR", None)
        else:
            os.environ["MLCHAOS_STATE_DIR"] = previous
