"""The game day: an operator-driven run with a blast radius and live state (``mlchaos gameday``).

The module ``chaos.gameday`` of releases before 0.2 is now :mod:`chaos.gameday.engine`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("chaos.gameday", "chaos.gameday.engine")
