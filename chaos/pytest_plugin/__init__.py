"""The mlchaos pytest plugin (entry point ``pytest11: mlchaos`` -> :mod:`chaos.pytest_plugin.plugin`).

The module ``chaos.pytest_plugin`` of releases before 0.2 is now :mod:`chaos.pytest_plugin.plugin`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("chaos.pytest_plugin", "chaos.pytest_plugin.plugin")
