"""The client side: start, watch and wait on runs."""

from aiworker.workers import moved_names

__getattr__ = moved_names(__name__, "aiworker.workers.client.client")
