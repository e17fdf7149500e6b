"""The running service: the loop (observe -> decide -> act) and its own housekeeping."""
