"""Deterministic workflow code; calls workers by activity name only."""

from workflows.pipeline import PipelineWorkflow

__all__ = ["PipelineWorkflow"]
