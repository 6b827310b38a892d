"""Slurm as a place where jobs run: a typed client for ``sbatch``/``squeue``/``scontrol``/``sacct``
(:mod:`chaos.cluster.slurm.client`) that works through any Transport: this machine (the testbed of
:mod:`chaos.cluster.testbed.slurm`) or a login node of an existing cluster reached over SSH."""

from chaos.cluster.slurm.client import (
    AccountingRecord,
    Job,
    JobNotFound,
    Node,
    QueuedJob,
    SlurmClient,
    SlurmError,
    expand_hostlist,
    login_client,
)

__all__ = [
    "AccountingRecord",
    "Job",
    "JobNotFound",
    "Node",
    "QueuedJob",
    "SlurmClient",
    "SlurmError",
    "expand_hostlist",
    "login_client",
]
