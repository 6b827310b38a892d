"""The run's one timeline: typed events, the append-only JSONL history, recorders and log-line matchers."""
