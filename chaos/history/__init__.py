"""The run's one timeline: typed events, the append-only JSONL history, recorders and log-line matchers.

The module ``chaos.history`` of releases before 0.2 is now :mod:`chaos.history.timeline`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("chaos.history", "chaos.history.timeline")
