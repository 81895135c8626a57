"""A pipeline's Temporal Priority: its ``priority`` key and its tenant as the fairness key.

Temporal orders a backlogged task queue by ``priority_key`` (1 first) and, with
fairness on, shares dispatch between ``fairness_key`` values in proportion to
their ``fairness_weight``. aiworker sets all three when it starts a pipeline
(:func:`start_priority`): the spec's ``priority``, the tenant, and the tenant's
``fairness_weight`` from the registry when one is configured. A registry entry's
``highest_priority`` caps the key: a spec asking for a more urgent one (a lower
number) starts at the ceiling, as every other registry ceiling tightens what a
spec asks for; a spec without a priority starts at the ceiling when the server's
default (3) would be above it.

The server lets activities and child workflows inherit each field they leave
unset from the workflow that schedules them, at dispatch time, without writing
it into their history events. A pipeline started without a priority (by
``temporal workflow start``) would so run its steps at the default level
whatever its spec says; :func:`task_priority` is what the workflow puts on
each activity and child instead, only when there is a priority key to carry,
so a pipeline without one schedules exactly the commands it always did.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from temporalio.common import Priority

from aiworker.schemas.names import DEFAULT_TENANT, PRIORITY_HIGHEST, PRIORITY_LOWEST, TENANT_PATTERN
from aiworker.schemas.tenants import TenantRegistry

_TENANT = re.compile(TENANT_PATTERN)
# What the server gives a task without a priority key (its default of 5 levels).
DEFAULT_PRIORITY_KEY = 3

__all__ = ["start_priority", "task_priority"]


def _priority_key(value: Any) -> int | None:
    """A valid ``priority`` value, or None (a bad one is the spec check's to refuse)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if PRIORITY_HIGHEST <= value <= PRIORITY_LOWEST else None
    return None


def start_priority(pipeline: Mapping[str, Any], tenants: TenantRegistry | None) -> Priority:
    """The Priority a pipeline workflow starts with.

    Read from the raw spec, so that a client that leaves the check to the
    workflow still starts it: a value the check would refuse is left out
    here (the workflow then fails with ``invalid_input``), never sent to the
    server to be refused as a request error.

    Args:
        pipeline: the pipeline spec as JSON.
        tenants: the tenant registry, for the tenant's ``fairness_weight``.

    Returns:
        ``priority_key`` from ``priority`` held to the tenant's
        ``highest_priority``, ``fairness_key`` the tenant, and
        ``fairness_weight`` the registry's for that tenant (unset without one).
    """
    tenant = pipeline.get("tenant", DEFAULT_TENANT)
    if not isinstance(tenant, str) or not _TENANT.match(tenant):
        tenant = None
    policy = tenants.policy(tenant) if tenants is not None and tenant is not None else None
    key = _priority_key(pipeline.get("priority"))
    ceiling = policy.highest_priority if policy is not None else None
    if ceiling is not None and (DEFAULT_PRIORITY_KEY if key is None else key) < ceiling:
        key = ceiling
    return Priority(
        priority_key=key,
        fairness_key=tenant,
        fairness_weight=policy.fairness_weight if policy is not None else None,
    )


def task_priority(
    own: Priority,
    priority_key: int | None,
    fairness_key: str,
    fairness_weight: float | None = None,
) -> Priority:
    """The Priority a run puts on each activity and child workflow it schedules.

    What the run itself was started with wins field by field (a starter's
    ``--priority-key`` over the spec's ``priority``); the spec, its tenant and
    the registry's weight fill the rest.

    Args:
        own: the run's own priority (``workflow.info().priority``).
        priority_key: the spec's ``priority`` (None for a for_each chunk, which
            has its parent's in ``own``).
        fairness_key: the pipeline's tenant.
        fairness_weight: the tenant's registry weight, if there is one.

    Returns:
        ``Priority.default`` (the commands carry nothing, as before priorities
        existed) when neither the run nor its spec has a priority key; else the
        full priority, so each task's history event shows what it ran with.
    """
    key = own.priority_key or priority_key
    if key is None:
        return Priority.default
    return Priority(
        priority_key=key,
        fairness_key=own.fairness_key or fairness_key,
        fairness_weight=own.fairness_weight or fairness_weight,
    )
