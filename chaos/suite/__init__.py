"""Suites (many runs in one go), the SQLite run history and the Prometheus metrics of a suite.

The module ``chaos.suite`` of releases before 0.2 is now :mod:`chaos.suite.run_suite`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("chaos.suite", "chaos.suite.run_suite")
