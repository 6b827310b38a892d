"""Transports: how the harness runs commands on hosts (local now; SSH and Docker behind the same protocol)."""

from chaos import with_moved

with_moved(__path__)  # pre-0.2 submodule paths: stubs in _moved/ (chaos.MOVED_MODULES)
