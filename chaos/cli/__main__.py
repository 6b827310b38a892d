"""``python -m chaos.cli``: the ``mlchaos`` command."""

from chaos.cli.commands import main

main()
