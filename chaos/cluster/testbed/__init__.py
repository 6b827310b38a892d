"""Multi-host testbeds on this machine: network namespaces running sshd, or Docker containers."""
