"""How target jobs start and report to mlchaos, plus the reference jobs the harness tests itself against."""

from chaos import with_moved

with_moved(__path__)  # pre-0.2 submodule paths: stubs in _moved/ (chaos.MOVED_MODULES)
