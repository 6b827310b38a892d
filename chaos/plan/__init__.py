"""From scenario to plan: fault ops with resolved triggers, the plan file handed to the in-job agent, and
the one function that derives every seed of a run from the run's seed.

The module ``chaos.plan`` of releases before 0.2 is now :mod:`chaos.plan.build`; its names still resolve here, with a
DeprecationWarning, until 0.3."""

from chaos import forward_moved_names

__getattr__ = forward_moved_names("chaos.plan", "chaos.plan.build")
