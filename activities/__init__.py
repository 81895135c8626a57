"""AI workers (one module each), the SDK base they share and the runtime that runs them."""

from aiworker.activities.errors import WorkerError
from aiworker.activities.runtime import WorkerContext, WorkerResult, WorkerRuntime
from aiworker.activities.sdk import Worker
from aiworker.activities.toolbox import Toolbox

__all__ = ["Toolbox", "Worker", "WorkerContext", "WorkerError", "WorkerResult", "WorkerRuntime"]
