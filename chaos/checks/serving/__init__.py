"""Serving checks (``error_rate``, ``latency``, ``failover_within``, ...) and the load windows they judge over."""
