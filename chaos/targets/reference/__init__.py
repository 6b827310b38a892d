"""The reference jobs the harness tests itself against: a DDP trainer and a serving stack."""
