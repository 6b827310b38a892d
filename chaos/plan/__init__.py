"""From scenario to plan: fault ops with resolved triggers, the plan file handed to the in-job agent, and
the one function that derives every seed of a run from the run's seed."""
