"""Temporal Schedules for pipelines (aiworker schedule)."""
