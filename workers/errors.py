"""The error a process raises when it cannot start (its own module: the worker
process and the tool builders both raise it, and neither imports the other)."""

from __future__ import annotations


class StartupError(RuntimeError):
    """The process cannot start; the message says why and what to do."""
