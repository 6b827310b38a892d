"""Transports: how the harness runs commands on hosts (local now; SSH and Docker behind the same protocol)."""
