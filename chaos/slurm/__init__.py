"""Slurm as a place where jobs run: a typed client for ``sbatch``/``squeue``/``scontrol``/``sacct``
(:mod:`chaos.slurm.client`) that works through any Transport: this machine (the testbed of
:mod:`chaos.testbed.slurm`) or a login node of an existing cluster reached over SSH; which cluster a scenario
talks to (:mod:`~chaos.slurm.locate`), a job's wall time from Slurm's record (:mod:`~chaos.slurm.accounting`),
and the node health check slurmd runs (:mod:`~chaos.slurm.healthcheck`)."""

from chaos.slurm.client import (
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
