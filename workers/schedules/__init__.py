"""Temporal Schedules for pipelines (aiworker schedule)."""

from aiworker.workers import moved_names

__getattr__ = moved_names(__name__, "aiworker.workers.schedules.schedules")
