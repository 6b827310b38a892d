"""Reporters: run.json, junit.xml (and later report.html) from a finished run."""
