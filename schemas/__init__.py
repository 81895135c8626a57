"""The contracts of aiworker: protocol models, worker specs, error codes,
pipeline spec. Pure models and functions; no I/O on import.
"""

from aiworker.schemas.errors import ErrorCode, is_retryable
from aiworker.schemas.pipeline import PipelineResult, PipelineSpec, Step, StepResult
from aiworker.schemas.protocol import (
    ArtifactRef,
    ErrorInfo,
    Observability,
    RequestConstraints,
    TraceContext,
    Usage,
    WarningInfo,
    WorkerRequest,
    WorkerResponse,
)
from aiworker.schemas.spec import WorkerSpec

__all__ = [
    "ArtifactRef",
    "ErrorCode",
    "ErrorInfo",
    "Observability",
    "PipelineResult",
    "PipelineSpec",
    "RequestConstraints",
    "Step",
    "StepResult",
    "TraceContext",
    "Usage",
    "WarningInfo",
    "WorkerRequest",
    "WorkerResponse",
    "WorkerSpec",
    "is_retryable",
]
