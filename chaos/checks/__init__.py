"""Assertion modules: pure functions of a recorded History that return pass / fail / unknown with evidence.

Each module registers its checks with :func:`chaos.checks.base.register_check` on import; the registry
(:mod:`chaos.plugins.registry`) imports the built-in ones (``detection``, ``recovery``, ``lineage``). A check never
talks to the target and never passes vacuously: when the fault it judges never fired, or the events it
needs are missing, it returns ``unknown`` and names what was missing.
"""
