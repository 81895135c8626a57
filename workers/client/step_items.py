"""A for_each step's items as a list, whether its result holds them inline or by
reference (:class:`~aiworker.schemas.pipeline.ItemsRef`).

Above ``AIWORKER_FOREACH_INLINE_ITEMS`` items a for_each's ``outputs.items`` in
the result is a reference to parts in the tenant's artifact store;
:meth:`aiworker.workers.client.client.PipelineClient.items`, ``aiworker items`` and the
front door's ``GET /v1/pipelines/{id}/steps/{step}/items`` read it here, with
the store and the loader the workflow's ``foreach-load-items`` uses
(:func:`aiworker.activities.items.load_items`). The tenant is always the run's
(its spec's), never one the caller names: the store refuses another tenant's
parts (``access_denied``).

A client run from another folder than the stack that wrote the parts (a
``file://`` store under another data directory) reads them where the result
says they are, as long as they are that tenant's artifacts
(``FileArtifactStore(elsewhere=True)``, whose docstring says why that is safe);
when they are not on this machine, the error names the store this process has
and the setting to change (``not_found``), not tenancy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiworker.config.settings import Settings
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.pipeline import ItemsRef


class StepItemsError(RuntimeError):
    """A step's items cannot be given; ``code`` says why, the message names the step.

    Attributes:
        code: ``not_found`` (no such step, or it produced no items),
            ``invalid_input`` (not a for_each step, a malformed reference, or a
            part that is not a part: corrupt), ``payload_too_large`` (more items
            than ``AIWORKER_MAX_FOREACH_ITEMS``), or the artifact store's code for
            a part it could not give (``not_found``, ``access_denied``, ...).
        step: the step id.
    """

    def __init__(self, message: str, code: ErrorCode, *, step: str) -> None:
        super().__init__(message)
        self.code = code
        self.step = step


class ItemsPartError(StepItemsError):
    """A stored part of the items could not be read: missing (``not_found``),
    corrupt (``invalid_input``), another tenant's (``access_denied``), or the store
    did not answer. The run's data is damaged or out of reach, not the request.

    Attributes:
        part: the URI of the part being read (also one inside an index part).
    """

    def __init__(self, message: str, code: ErrorCode, *, step: str, part: str | None) -> None:
        super().__init__(message, code, step=step)
        self.part = part


def spec_step(pipeline: Mapping[str, Any], step_id: str) -> Mapping[str, Any]:
    """The spec of ``step_id`` in a pipeline's JSON, which must be a for_each step.

    Raises:
        StepItemsError: no such step (``not_found``), or not a for_each (``invalid_input``).
    """
    steps = pipeline.get("steps")
    for step in steps if isinstance(steps, list) else ():
        if isinstance(step, Mapping) and step.get("id") == step_id:
            if step.get("for_each") is None:
                raise StepItemsError(
                    f"step {step_id!r} is not a for_each step: it has no items",
                    ErrorCode.INVALID_INPUT,
                    step=step_id,
                )
            return step
    raise StepItemsError(f"the pipeline has no step {step_id!r}", ErrorCode.NOT_FOUND, step=step_id)


async def read_items(
    settings: Settings, tenant: str, step_id: str, step: Mapping[str, Any] | None
) -> list[Any]:
    """The items of one step's result (``step``: its JSON, None when it has none):
    its inline ``outputs.items``, or the list its reference stands for, read from
    the configured artifact store as ``tenant`` (``null`` where an item failed).

    Args:
        settings: the store (``AIWORKER_ARTIFACT_STORE``) and the cap on items.
        tenant: the run's tenant (its spec's).
        step_id: the step, for messages.
        step: the step's result as JSON (``status``, ``outputs``, ...).

    Raises:
        StepItemsError: the step has no items, too many, or a part cannot be read.
    """
    outputs = step.get("outputs") if step else None
    value = outputs.get("items") if isinstance(outputs, Mapping) else None
    if isinstance(value, list):
        return value
    if value is None:
        status = step.get("status") if step else "not reached"
        raise StepItemsError(
            f"step {step_id!r} has no items (its status is {status or 'unknown'})",
            ErrorCode.NOT_FOUND,
            step=step_id,
        )
    ref = ItemsRef.of(value)  # None for a malformed reference too
    if ref is None:
        raise StepItemsError(
            f"step {step_id!r}: outputs.items is neither a list nor an items reference",
            ErrorCode.INVALID_INPUT,
            step=step_id,
        )
    # The engine never made a step of more; a larger count is not the engine's.
    cap = settings.caps.max_foreach_items
    if ref.count > cap:
        raise StepItemsError(
            f"step {step_id!r} has {ref.count} items, more than AIWORKER_MAX_FOREACH_ITEMS ({cap})",
            ErrorCode.PAYLOAD_TOO_LARGE,
            step=step_id,
        )
    # The store's modules load here, not with the client (aiworker.workers.client.client
    # imports this module); most of the client's users never read a reference.
    from aiworker.activities.errors import WorkerError
    from aiworker.activities.items import load_items
    from aiworker.workers.process.resources import artifact_store

    # The process's S3 connection (when the store is S3) stays open for the next
    # read; a command closes it as it ends (resources.close_connections).
    try:
        return await load_items(artifact_store(settings, elsewhere=True), tenant, ref)
    except WorkerError as e:
        raise ItemsPartError(
            f"step {step_id!r}: an items part could not be read: {e.message}",
            e.code,
            step=step_id,
            part=e.context.get("uri"),
        ) from None


__all__ = ["ItemsPartError", "StepItemsError", "read_items", "spec_step"]
