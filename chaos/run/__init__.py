"""The orchestrator and what it needs: the execution of one scenario, golden runs, operator control, results."""
