"""Worker conformance checks (aiworker conformance)."""

from aiworker.workers import moved_names

__getattr__ = moved_names(__name__, "aiworker.workers.conformance.run")
