"""The mlchaos pytest plugin (entry point ``pytest11: mlchaos`` -> :mod:`chaos.pytest_plugin.plugin`)."""
