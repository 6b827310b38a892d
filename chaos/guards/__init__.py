"""Detectors that run INSIDE the user's training job and report through :func:`chaos.events.emit`.

- :mod:`chaos.guards.checksum`: checksummed all-reduce (a DDP communication hook and a standalone
  ``checksummed_all_reduce``) that detects silent data corruption in a gradient reduction, localizes it,
  and retries, skips the step or raises; emits ``detect.sdc``. Its rounding-error bounds live in
  :mod:`chaos.guards.rounding` (pure tensor functions, with the derivation of the tolerance).
- :mod:`chaos.guards.anomaly`: gradient anomaly guard (NaN/Inf, a rank's gradient norm against its peers and
  its own history, loss spikes); emits ``detect.grad_anomaly``. It sees the corruption no checksum of the
  reduction can: a fault in a rank's own computation, before anything is checksummed.
- :mod:`chaos.guards.straggler`: per-rank local step time vs the other ranks' (the straggler also has the
  shortest collective wait), gathered to rank 0; emits ``detect.straggler`` naming the slow rank.

All are collective: every rank of the group calls them in the same order, like any collective.
``chaos.analysis.sdc_coverage`` measures what each catches (``mlchaos sdc-coverage``).
"""
