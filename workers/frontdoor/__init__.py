"""The HTTP front door (aiworker serve)."""
