"""How target jobs start and report to mlchaos: one adapter per target type. The reference jobs the harness
tests itself against live in :mod:`chaos.reference` and are started by module path, never imported here."""
