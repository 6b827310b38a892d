"""Slurm node faults (``node_fail``, ``slurmd_stop``, ``drain``): :mod:`injectors.slurm.faults`; what they do to a
node and how heal undoes it: :mod:`injectors.slurm.nodes`."""
