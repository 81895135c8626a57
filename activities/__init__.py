"""AI workers (one module each) and the runtime they share."""

from activities.errors import WorkerError
from activities.runtime import Worker, WorkerContext, WorkerResult, WorkerRuntime
from activities.toolbox import Toolbox

__all__ = ["Toolbox", "Worker", "WorkerContext", "WorkerError", "WorkerResult", "WorkerRuntime"]
