"""Multi-host testbeds on this machine, built on the transports of :mod:`chaos.cluster`: network namespaces
running sshd, Docker containers, and a Slurm cluster on the namespace hosts (:mod:`chaos.testbed.slurm`)."""
