"""The ``clock`` fault family: a job's wall clock offset by a preloaded shim (see injectors/clock/shim.py)."""
