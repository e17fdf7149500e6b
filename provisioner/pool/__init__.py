"""Observe: reading the HTCondor pool (schedds' demand, pilots' startd ads, the event log)."""
