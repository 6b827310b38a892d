"""The ``mlchaos`` command line, one module per command group (entry point ``chaos.cli.commands:main``)."""
