"""The worker SDK: one definition per AI worker, owning its Temporal surface.

A worker is its spec (the published contract) and an ``execute`` method::

    class Slugify(aiworker.Worker):
        spec = "slugify.json"          # beside this module; or a dict, or a WorkerSpec

        async def execute(self, ctx: aiworker.Context, input: dict) -> aiworker.Result:
            return aiworker.Result(outputs={"slug": input["title"].lower().replace(" ", "-")})

From that one definition come the Temporal activity (name = ``worker_id``,
:meth:`Worker.activity`), its activity options (:meth:`Worker.activity_options`,
derived from the spec as for every call site), and the runtime wrapper that
validates input and output, enforces constraints and tools, maps failures to
stable codes and emits telemetry (:class:`~aiworker.activities.runtime.WorkerRuntime`).
Built-ins, plugins and prompt workers are all instances of :class:`Worker`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

from temporalio import activity

from aiworker.activities.runtime import WorkerContext, WorkerResult, WorkerRuntime
from aiworker.schemas.options import ActivityOptions, activity_options
from aiworker.schemas.protocol import RequestConstraints, WorkerResponse
from aiworker.schemas.spec import WorkerSpec

Activity = Callable[[dict[str, Any]], Awaitable[WorkerResponse]]


def _spec_of(cls: type, raw: object) -> WorkerSpec:
    """A class's ``spec`` attribute as a checked :class:`WorkerSpec`."""
    if isinstance(raw, WorkerSpec):
        return raw
    if isinstance(raw, dict):
        return WorkerSpec.model_validate(raw)
    if isinstance(raw, str | Path):
        path = Path(raw)
        if not path.is_absolute():
            module = sys.modules.get(cls.__module__)
            where = getattr(module, "__file__", None)
            base = Path(where).parent if where else Path.cwd()
            path = base / path
        return WorkerSpec.from_file(path)
    raise TypeError(
        f"{cls.__qualname__}.spec must be a WorkerSpec, a dict or a spec file path, "
        f"not {type(raw).__name__}"
    )


class Worker:
    """The base of every AI worker: subclass it, set ``spec``, write ``execute``.

    ``spec`` is read and checked when the class is defined, so a worker whose
    contract is broken fails its import (and a plugin process refuses to
    start, naming the file and field). Instances are built once per process,
    with no arguments; a worker reaches the outside world only through
    ``ctx.tools``, which holds what its spec's ``tools_allowed`` allows.
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

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:
        """Do the work on ``input`` (already valid against ``input_schema``).

        Return a :class:`WorkerResult` (its ``outputs`` are checked against
        ``output_schema``), or raise a ``WorkerError`` subclass for a failure
        with a stable code; any other exception is ``internal``.
        """
        raise NotImplementedError(f"{type(self).__qualname__} does not implement execute")

    def activity(self, runtime: WorkerRuntime) -> Activity:
        """This worker's Temporal activity, bound to ``runtime``; named by ``worker_id``."""

        async def run(request: dict[str, Any]) -> WorkerResponse:
            return await runtime.run(self, request)

        run.__name__ = run.__qualname__ = self.worker_id.replace("-", "_")
        run.__doc__ = self.spec.purpose
        run.__module__ = type(self).__module__
        return activity.defn(name=self.worker_id)(run)

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

    ``TypeError`` says what ``where`` held instead.
    """
    items: list[object]
    if isinstance(value, Worker) or inspect.isclass(value):
        items = [value]
    else:
        try:
            items = list(value)  # type: ignore[call-overload]
        except TypeError:
            raise TypeError(
                f"{where} is a {type(value).__name__}, not a Worker, a Worker subclass "
                "or an iterable of them"
            ) from None
    out: list[Worker] = []
    for item in items:
        if isinstance(item, Worker):
            out.append(item)
        elif inspect.isclass(item) and issubclass(item, Worker):
            if "spec" not in vars(item) and not isinstance(getattr(item, "spec", None), WorkerSpec):
                raise TypeError(f"{where}: {item.__qualname__} has no spec")
            out.append(item())
        else:
            raise TypeError(f"{where} holds {item!r}, which is not a Worker or a Worker subclass")
    return out
