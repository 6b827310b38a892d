"""Storage faults: a FUSE layer mounted over a directory (the injector and its host-side daemon).

The module ``injectors.storage`` of releases before 0.2 is now :mod:`injectors.storage.injector`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("injectors.storage", "injectors.storage.injector")
