"""Detectors that run beside a job, in the harness: the hang watch (:mod:`chaos.detect.hang_watch`) reads every
rank's collective flight recorder and ``/proc`` from outside and names the rank a hang waits for
(``detect.hang``); the link probe (:mod:`chaos.detect.link_probe`), on a hang where every rank waits, pings
between the ranks' hosts and names the bad link (``detect.link``). The orchestrator starts them; checks read
only the events they write."""
