"""Network faults: iptables (``partition``, ``packet_loss``, ``drop_large_packets``, ``flap``) and tc
(``bandwidth``, ``delay``, ``jitter``), with their host plumbing."""
