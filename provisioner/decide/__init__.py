"""Decide: the pure core (no I/O, no clock: `now` is passed in), from a Snapshot to Actions."""
