"""Deterministic workflow code; calls workers by activity name only."""

from workflows.foreach import PipelineForEachWorkflow
from workflows.pipeline import PipelineWorkflow

__all__ = ["PipelineForEachWorkflow", "PipelineWorkflow"]
