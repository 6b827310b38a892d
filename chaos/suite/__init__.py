"""Suites (many runs in one go), the SQLite run history and the Prometheus metrics of a suite."""
