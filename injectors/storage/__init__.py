"""Storage faults: a FUSE layer mounted over a directory (the injector and its host-side daemon)."""
