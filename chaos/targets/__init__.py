"""How target jobs start and report to mlchaos, plus the reference jobs the harness tests itself against."""
