"""Multi-host testbeds on this machine: network namespaces running sshd, or Docker containers.

The module ``chaos.cluster.testbed`` of releases before 0.2 is now :mod:`chaos.cluster.testbed.namespaces`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("chaos.cluster.testbed", "chaos.cluster.testbed.namespaces")
