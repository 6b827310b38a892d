"""Process faults (``kill``, ``freeze``, ``slow``) and the detached duty-cycle helper of ``slow``."""
