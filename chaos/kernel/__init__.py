"""What mlchaos reads of the kernel, standard library only, at the bottom of the layers (the harness, the in-job
agent and the guards share it): :mod:`chaos.kernel.procfs`, the one ``/proc/<pid>/stat`` reader."""
