"""Process faults (``kill``, ``freeze``, ``slow``) and the detached duty-cycle helper of ``slow``.

The module ``injectors.process`` of releases before 0.2 is now :mod:`injectors.process.faults`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("injectors.process", "injectors.process.faults")
