"""The reference jobs the harness tests itself against: a DDP trainer and a serving stack. Scenarios and
target adapters start them by module path (``python -m chaos.reference.trainer``); no adapter imports them."""
