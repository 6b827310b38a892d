"""Serving checks (``error_rate``, ``latency``, ``failover_within``, ...) and the load windows they judge over.

The module ``chaos.checks.serving`` of releases before 0.2 is now :mod:`chaos.checks.serving.verdicts`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("chaos.checks.serving", "chaos.checks.serving.verdicts")
