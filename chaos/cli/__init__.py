"""The ``mlchaos`` command line, one module per command group (entry point ``chaos.cli.commands:main``).

The module ``chaos.cli`` of releases before 0.2 is now :mod:`chaos.cli.commands`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("chaos.cli", "chaos.cli.commands")
