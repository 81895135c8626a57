"""The worker SDK: one definition per AI worker, owning its Temporal surface.

A worker is its spec (the published contract) and an ``execute`` method::

    class Slugify(aiworker.Worker):
        spec = "slugify.json"          # beside this module; or a dict, or a WorkerSpec

        async def execute(self, ctx: aiworker.Context, input: dict) -> aiworker.Result:
            return aiworker.Result(outputs={"slug": input["title"].lower().replace(" ", "-")})

From that one definition come the Temporal activity (name = ``worker_id``,
:meth:`Worker.activity`), its activity options (:meth:`Worker.activity_options`,
derived from the spec as for every call site), and the runtime wrapper that
validates input and output, enforces constraints and tools and maps failures to
stable codes (:class:`~aiworker.activities.runtime.WorkerRuntime`); the call's
span, log line and metrics come from the activity interceptor every worker
process registers (:mod:`~aiworker.activities.call_telemetry`).
Built-ins, plugins and prompt workers are all instances of :class:`Worker`.
"""

from __future__ import annotations

import inspect
import reprlib
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError
from temporalio import activity

from aiworker.activities.runtime import WorkerContext, WorkerResult, WorkerRuntime
from aiworker.schemas.batch import ItemsResult, ItemsTask, items_activity
from aiworker.schemas.options import ActivityOptions, activity_options
from aiworker.schemas.protocol import RequestConstraints, Usage, WorkerResponse
from aiworker.schemas.spec import WorkerSpec, describe_validation

Activity = Callable[[dict[str, Any]], Awaitable[WorkerResponse]]


def _spec_of(cls: type, raw: object) -> WorkerSpec:
    """A class's ``spec`` attribute as a checked :class:`WorkerSpec` of a python worker.

    ``ValueError`` names the spec file (or the class) and the field.
    """
    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    where = f"{cls.__qualname__}.spec" + (f" ({file})" if file else f" (module {cls.__module__})")
    if isinstance(raw, WorkerSpec):
        spec = raw
    elif isinstance(raw, dict):
        try:
            spec = WorkerSpec.model_validate(raw)
        except ValidationError as e:
            raise ValueError(f"{where}: {describe_validation(e)}") from None
    elif isinstance(raw, str | Path):
        path = Path(raw)
        if not path.is_absolute():
            path = (Path(file).parent if file else Path.cwd()) / path
        where = f"worker spec {path}"
        spec = WorkerSpec.from_file(path)
    else:
        raise TypeError(
            f"{where} must be a WorkerSpec, a dict or a spec file path, not {type(raw).__name__}"
        )
    if spec.kind != "python":
        # A class with code runs a python worker; a prompt or external worker
        # is a spec file alone, and serving it from a class would bypass the
        # machinery its kind names (llm-call, or nobody here at all).
        raise ValueError(
            f"{where}: implementation.kind is {spec.kind!r}, but {cls.__qualname__} is a "
            f"Worker class, which implements a 'python' worker ({spec.kind} workers are "
            "spec files in AIWORKER_WORKER_SPECS)"
        )
    return spec


class Worker:
    """The base of every AI worker: subclass it, set ``spec``, write ``execute``.

    ``spec`` is read and checked when the class is defined, so a worker whose
    contract is broken, or whose ``implementation.kind`` is not ``python``,
    fails its import (and a plugin process refuses to start, naming the file
    and field). Instances are built once per process, with no arguments; a
    worker reaches the outside world only through ``ctx.tools``, which holds
    what its spec's ``tools_allowed`` allows.
    """

    spec: ClassVar[WorkerSpec]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        raw = cls.__dict__.get("spec")
        if raw is not None:
            cls.spec = _spec_of(cls, raw)

    @property
    def worker_id(self) -> str:
        """The worker's id: its activity name, written once, in its spec."""
        return self.spec.worker_id

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        """Do the work on ``input`` (already valid against ``input_schema``).

        Return a :class:`WorkerResult` (its ``outputs`` are checked against
        ``output_schema``), or raise a ``WorkerError`` subclass for a failure
        with a stable code; any other exception is ``internal``.
        """
        raise NotImplementedError(f"{type(self).__qualname__} does not implement execute")

    def usage_if_lost(self, ctx: WorkerContext, input: dict[str, Any]) -> Usage:  # noqa: A002 (as execute)
        """The most one attempt of this call may consume, booked for an earlier attempt
        that ended without reporting its usage (its process killed, or timed out by
        the server; :mod:`~aiworker.activities.usage`).

        By default the attempt's token cap (as output tokens) and external-call cap,
        as the budget admitted them; 0 where the worker has none. Override it where
        the input says more (``llm-call``: the prompt estimate plus ``max_tokens``).
        """
        return Usage(
            output_tokens=ctx.max_tokens or 0, external_calls=ctx.tools.max_external_calls or 0
        )

    def activity(self, runtime: WorkerRuntime) -> Activity:
        """This worker's Temporal activity, bound to ``runtime``; named by ``worker_id``."""

        async def run(request: dict[str, Any]) -> WorkerResponse:
            return await runtime.run(self, request)

        run.__name__ = run.__qualname__ = self.worker_id.replace("-", "_")
        run.__doc__ = self.spec.purpose
        run.__module__ = type(self).__module__
        return activity.defn(name=self.worker_id)(run)

    def items_activity(
        self, runtime: WorkerRuntime
    ) -> Callable[[ItemsTask], Awaitable[ItemsResult]]:
        """This worker's items activity (``<worker_id>.items``): several for_each items
        in one task, each run as :meth:`activity` runs one (:meth:`WorkerRuntime.run_items`)."""

        async def run_items(task: ItemsTask) -> ItemsResult:
            return await runtime.run_items(self, task)

        run_items.__name__ = run_items.__qualname__ = self.worker_id.replace("-", "_") + "_items"
        run_items.__doc__ = f"{self.spec.purpose} (several for_each items per task)"
        run_items.__module__ = type(self).__module__
        return activity.defn(name=items_activity(self.worker_id))(run_items)

    def activity_options(
        self,
        *,
        constraints: RequestConstraints | None = None,
        max_attempts: int | None = None,
        queue_suffix: str = "",
    ) -> ActivityOptions:
        """Keyword arguments for ``workflow.execute_activity`` of this worker, from its spec."""
        return activity_options(
            self.spec, constraints=constraints, max_attempts=max_attempts, queue_suffix=queue_suffix
        )

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} {self.worker_id} {self.spec.version}>"


def workers_in(value: object, *, where: str) -> list[Worker]:
    """The workers a plugin names: a worker, a worker class, or an iterable of them.

    Classes are instantiated here (with no arguments). Every problem is a
    ``TypeError`` whose message starts with ``where`` and says what it held
    instead: not a worker, a class without a spec, an ``execute`` that is
    missing or not ``async``, a constructor that failed.
    """
    items: list[object]
    if isinstance(value, Worker) or inspect.isclass(value):
        items = [value]
    elif isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        # A string or a mapping is iterable, but its characters or keys are
        # never what the author meant to list.
        raise TypeError(
            f"{where} is a {type(value).__name__}, not a Worker, a Worker subclass "
            "or an iterable of them"
        )
    else:
        try:
            items = list(value)
        except Exception as e:
            raise TypeError(f"{where}: listing its workers failed: {type(e).__name__}: {e}") from e
    out: list[Worker] = []
    for item in items:
        if inspect.isclass(item) and issubclass(item, Worker):
            out.append(_instance(item, where))
        elif isinstance(item, Worker):
            if not isinstance(getattr(item, "spec", None), WorkerSpec):
                raise TypeError(f"{where}: a {type(item).__qualname__} without a spec")
            _check_execute(type(item), where)
            out.append(item)
        else:
            raise TypeError(
                f"{where} holds {reprlib.repr(item)}, which is not a Worker or a Worker subclass"
            )
    return out


def _instance(cls: type[Worker], where: str) -> Worker:
    if not isinstance(getattr(cls, "spec", None), WorkerSpec):
        raise TypeError(f"{where}: {cls.__qualname__} has no spec")
    _check_execute(cls, where)
    try:
        return cls()
    except Exception as e:
        raise TypeError(f"{where}: {cls.__qualname__}() failed: {type(e).__name__}: {e}") from e


def _check_execute(cls: type[Worker], where: str) -> None:
    # Caught here, at process start, rather than as `internal` on every call.
    execute = cls.execute
    if execute is Worker.execute:
        raise TypeError(f"{where}: {cls.__qualname__} does not implement execute")
    if not inspect.iscoroutinefunction(execute):
        raise TypeError(f"{where}: {cls.__qualname__}.execute must be 'async def'")
