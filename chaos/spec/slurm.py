"""The ``slurm`` target: a batch job submitted to a Slurm cluster with ``sbatch --requeue``.

Where it is submitted: with ``login: null`` (default) to the Slurm testbed of this machine (``mlchaos testbed
up --slurm``), found through the scenario's inventory (the testbed writes one with its hosts labelled
``slurm_node``), or the default testbed when there is none; with ``login: HOST`` on that inventory host, the
login node of an existing cluster, over SSH (``conf``: its slurm.conf when not at the default path).

The job reports like any other through ``CHAOS_EVENTS``, which names a file in the run dir: testbed hosts share
this machine's filesystem; on an existing cluster the run dir must be on a filesystem the compute nodes
share, at the same path (as checkpoints are).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chaos.spec.matchers import LogMatcherSpec, Signatures
from chaos.spec.units import Argv, Duration, EnvVars, Name

_STRICT = ConfigDict(extra="forbid", frozen=True)
_SLURM_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"


class SlurmTarget(BaseModel):
    """A batch script submitted with ``sbatch --nodes N --ntasks-per-node T [--requeue]``; the script runs the
    job's steps itself (``srun python3 train.py``, ``srun torchrun ...``), as users' scripts do."""

    model_config = _STRICT
    type: Literal["slurm"]
    script: Name = Field(
        description="the batch script (a path relative to the scenario file; on an existing cluster it must exist "
        "at the same absolute path on the login node)"
    )
    args: Argv = Field(
        default=[],
        description="the script's arguments ({run_dir}, {seed}, {scenario_dir} and {python}, mlchaos's interpreter, "
        "are filled in)",
    )
    nodes: int = Field(default=1, ge=1, description="sbatch --nodes")
    ntasks_per_node: int = Field(default=1, ge=1, description="sbatch --ntasks-per-node")
    partition: str | None = Field(
        default=None, pattern=_SLURM_NAME, description="sbatch --partition (null: the cluster's default)"
    )
    requeue: bool = Field(default=True, description="sbatch --requeue: a node failure requeues the job, same id")
    job_name: str | None = Field(default=None, pattern=_SLURM_NAME, description="null: mlchaos-<run dir name>")
    time_limit: Duration | None = Field(
        default=None,
        gt=0,
        description="sbatch --time, never more than the run's max_duration + heal_grace (null: that bound; whole minutes)",
    )
    sbatch: Argv = Field(
        default=[], description="further sbatch options, each one word starting with '-' (e.g. [--exclusive])"
    )
    env: EnvVars = Field(
        default={},
        description="exported into the job ({run_dir}, {seed}, {scenario_dir} and {python} are filled in)",
    )
    login: Name | None = Field(
        default=None,
        description="the inventory host that is the login node of an existing cluster (null: this machine's "
        "Slurm testbed)",
    )
    conf: Name | None = Field(default=None, description="with login: the cluster's slurm.conf on the login node")
    accounting: Literal["slurmdbd", "completion_log"] = Field(
        default="slurmdbd",
        description="with login: where sacct reads finished attempts (the testbed always uses its completion log)",
    )
    poll_interval: Duration = Field(
        default=0.5, ge=0.1, le=10, description="how often Slurm is asked for the job's and nodes' state"
    )
    matchers: list[LogMatcherSpec] = []
    signatures: Signatures = "all"

    @field_validator("sbatch")
    @classmethod
    def _options(cls, words: list[str]) -> list[str]:
        for word in words:
            if not word.startswith("-"):
                raise ValueError(f"sbatch option {word!r} does not start with '-' (give --opt=value as one word)")
            name = word.split("=", 1)[0]
            if name in _OWNED:
                raise ValueError(f"{name} is set by the target's own field {_OWNED[name]}: use that")
        return words


# sbatch options the target sets from its own fields (one source of truth for each).
_OWNED = {
    "--nodes": "nodes",
    "-N": "nodes",
    "--ntasks-per-node": "ntasks_per_node",
    "--partition": "partition",
    "-p": "partition",
    "--requeue": "requeue",
    "--no-requeue": "requeue",
    "--job-name": "job_name",
    "-J": "job_name",
    "--time": "time_limit",
    "-t": "time_limit",
    "--output": "(the run dir's target.log)",
    "-o": "(the run dir's target.log)",
    "--export": "env",
    "--parsable": "(always set)",
}
