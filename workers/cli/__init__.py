"""The aiworker command line."""

from aiworker.workers import moved_names

__getattr__ = moved_names(__name__, "aiworker.workers.cli.main")
