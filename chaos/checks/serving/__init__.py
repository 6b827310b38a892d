"""Serving checks (``error_rate``, ``latency``, ``failover_within``, ...; streams: ``ttft_within``,
``streams_completed``, ...; the fallback ladder: ``fallback_ladder``, ``fallback_share_alert``) and the load windows
they judge over."""
