"""Everything that makes healing unconditional: the journal, the local and remote dead-man switches, signal
handling that lets ``finally`` run, and the state folder they share."""
