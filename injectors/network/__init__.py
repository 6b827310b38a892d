"""Network faults: iptables (``partition``, ``packet_loss``, ``drop_large_packets``, ``flap``) and tc
(``bandwidth``, ``delay``, ``jitter``), with their host plumbing.

The module ``injectors.network`` of releases before 0.2 is now :mod:`injectors.network.faults`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("injectors.network", "injectors.network.faults")
