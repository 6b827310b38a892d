"""What mlchaos reads of the kernel, standard library only, at the bottom of the layers (the harness, the in-job
agent and the guards share it): :mod:`chaos.kernel.procfs`, the one ``/proc/<pid>/stat`` reader;
:mod:`chaos.kernel.mounts`, the one mountinfo reader (and where the cpu cgroup is mounted);
:mod:`chaos.kernel.durable`, fsync of a path (a file's bytes or a directory's entries)."""
