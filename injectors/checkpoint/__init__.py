"""Checkpoint faults: torn writes, corrupt files, dropped shards and stale ``latest`` pointers on real checkpoint
files (:mod:`injectors.checkpoint.injector`), with their host-side file operations (:mod:`injectors.checkpoint.ops`)
and the torn-write watcher (:mod:`injectors.checkpoint.tear`)."""
