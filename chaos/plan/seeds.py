"""Every random stream of a run, derived from the run's one seed by one function.

A run replays exactly from its seed and plan (ARCHITECTURE rule 4) only if nothing draws from an rng seeded some
other way. Each consumer names its purpose (``"target"``, an op id and rank, ``"arrivals"``); the same seed and
purpose always give the same stream, and different purposes give independent ones.
"""

from __future__ import annotations

import random

Part = int | str


def derive_seed(run_seed: int, *purpose: Part) -> int | str:
    """The seed of the stream for ``purpose`` under ``run_seed``: the run seed itself for the plan's own stream
    (no purpose), else ``"run_seed:part:part"`` (``random.Random`` hashes a string seed with SHA-512)."""
    if not purpose:
        return run_seed
    return ":".join(str(part) for part in (run_seed, *purpose))


def derive_rng(run_seed: int, *purpose: Part) -> random.Random:
    """A ``random.Random`` for ``purpose``, derived from ``run_seed`` (see :func:`derive_seed`)."""
    return random.Random(derive_seed(run_seed, *purpose))
