"""The reference serving stack: two model servers (a primary torch model and a smaller fallback) behind a
gateway with health and correctness probes, a fallback ladder, circuit breakers, failback hysteresis and
priority load shedding. ``type: serving`` in a scenario starts it; :mod:`chaos.load` drives load at it."""
