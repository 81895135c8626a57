"""Models of the cross-process limiter (rate limits and concurrency leases)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field
from typing_extensions import TypeAliasType

from aiworker.schemas.base import Model
from aiworker.schemas.caps import DEFAULT_FOREACH_INLINE_ITEMS, Caps
from aiworker.schemas.names import TENANT_PATTERN
from aiworker.schemas.spec import RecordedSpec
from aiworker.schemas.tenants import TenantPolicy


class AcquireRequest(Model):
    """A request for one permit, sent by a pipeline to the key's limiter."""

    requester: str = Field(description="workflow id that receives the permit signal")
    ticket: str = Field(min_length=1, max_length=300)
    kind: Literal["rate", "concurrency"]
    limit: int = Field(ge=1)
    period_seconds: float = Field(default=60.0, gt=0, description="rate window")
    lease_seconds: float = Field(
        default=3600.0, gt=0, description="a concurrency lease expires after this (crash safety)"
    )


class Permit(Model):
    """The limiter's answer: the ticket may go now."""

    ticket: str
    key: str
    waited_seconds: float = 0.0
    granted_at: float | None = Field(
        default=None, description="the limiter's time of the grant (seconds since the epoch)"
    )


class BlockRequest(Model):
    """A worker process asks for a block of up to ``count`` rate permits for its own
    pool, usable for ``ttl_seconds`` from the moment it sent the request."""

    count: int = Field(ge=1, le=1000)
    ttl_seconds: float = Field(gt=0, le=60)
    limit: int = Field(ge=1)
    period_seconds: float = Field(gt=0)


class BlockGrant(Model):
    """How many permits of a :class:`BlockRequest` the limiter granted (at least one)."""

    count: int = Field(ge=1)
    ttl_seconds: float = Field(gt=0)


class LimiterState(Model):
    """What a limiter carries across continue-as-new."""

    key: str
    kind: Literal["rate", "concurrency"] = "rate"
    limit: int = 1
    period_seconds: float = 60.0
    grants: list[float] = Field(default_factory=list, description="grant times (rate)")
    holders: dict[str, float] = Field(default_factory=dict, description="ticket -> lease end")
    waiters: list[tuple[AcquireRequest, float]] = Field(
        default_factory=list, description="(request, time queued), in arrival order"
    )
    leases: dict[str, AcquireRequest] = Field(
        default_factory=dict, description="ticket -> the request it was granted for"
    )
    granted_total: int = 0
    blocks: list[tuple[float, int, float]] = Field(
        default_factory=list,
        description="(granted at, permits, ttl seconds) of the blocks leased to worker "
        "processes: each counts as used anywhere in [granted at, granted at + ttl]",
    )


class LeaseCheck(Model):
    """The limiter asks whether ``ticket`` is still held; the holder releases it if not."""

    ticket: str
    limiter_id: str


class RateCall(Model):
    """Ask for a rate-limit permit: the worker's limit for the tenant (settings decide
    which limit applies, if any)."""

    kind: Literal["rate"] = "rate"
    worker_id: str = Field(description="the worker the call goes to")
    tenant: str = Field(default="default", pattern=TENANT_PATTERN)
    requester: str = Field(description="workflow id that receives the permit signal")
    ticket: str


class ConcurrencyCall(Model):
    """Ask for a concurrency lease: at most ``limit`` holders of ``key`` at once."""

    kind: Literal["concurrency"] = "concurrency"
    key: str = Field(description="the resolved concurrency key")
    limit: int = Field(ge=1)
    requester: str = Field(description="workflow id that receives the permit signal")
    ticket: str
    lease_seconds: float = 3600.0
    scope: Literal["key", "tenant"] = Field(
        default="key",
        description="tenant: `key` is a tenant name and the lease counts its pipelines "
        "(the registry's concurrency ceiling), apart from every spec's keys",
    )


# The input of the ``limiter-acquire`` activity. A type alias object, not a bare
# ``Annotated``: the SDK reads activity parameter types with ``get_type_hints``,
# which strips ``Annotated`` (and the discriminator with it), but keeps an alias.
AcquireCall = TypeAliasType(
    "AcquireCall", Annotated[RateCall | ConcurrencyCall, Field(discriminator="kind")]
)


class AcquireBatch(Model):
    """The input of ``limiter-acquire-many``: requests one workflow task asks together."""

    calls: list[AcquireCall] = Field(min_length=1, max_length=1000)


class AcquireResult(Model):
    """What the ``limiter-acquire`` activity did."""

    limited: bool = Field(description="false when no limit applies: go at once")
    key: str | None = None
    limiter_id: str | None = Field(default=None, description="workflow id of the limiter")
    limit: int | None = None
    period_seconds: float | None = None
    pooled: bool = Field(
        default=False,
        description="granted at once from the process's leased block (limited is false)",
    )
    asked_at: float | None = Field(
        default=None, description="wall-clock time the process took the request (seconds)"
    )
    granted_at: float | None = Field(
        default=None, description="wall-clock time a pooled permit was taken (seconds)"
    )


class AcquireResults(Model):
    """What ``limiter-acquire-many`` did, one answer per request, in order."""

    results: list[AcquireResult]


class RunConfigCall(Model):
    """Input of the ``run-config`` activity: the run asking for its run config."""

    tenant: str = Field(pattern=TENANT_PATTERN)
    workers: list[str] = Field(description="the workers the run calls: which are rate limited")
    resume_from: str | None = Field(
        default=None, description="the redriven run's workflow id: it must be the same tenant's"
    )
    record: list[str] | None = Field(
        default=None,
        description="the workers whose specs the run config records "
        "(schemas.recorded.named_workers); None: none",
    )
    record_all: bool = Field(
        default=False,
        description="record every worker the answering process knows: an llm-agent step's "
        "tools refer to a step's outputs (schemas.recorded.open_tools)",
    )
    pipeline: dict[str, Any] | None = Field(
        default=None,
        description="the pipeline to check in full here (schemas, patterns, each step's input "
        "against its worker's contract), off the workflow task; None: the run checks it itself",
    )


class RunConfig(Model):
    """A pipeline run's configuration, taken once at its start from the process's
    settings and catalog: the workers whose calls go through a rate limiter, the
    tenant's registry entry (None: no registry), the process's caps, the workers
    it runs as local activities, the for_each inline threshold and the specs of
    the workers the run names.

    It is a local activity's result, so it is recorded in the pipeline's
    history: a replay (on any process, with any settings) makes the same calls
    the run made, and a run started before ``local`` existed decodes it empty
    and replays its calls as activities. The run decides from the recorded
    specs (``specs``, see :mod:`aiworker.schemas.recorded`), never from the
    catalog of the process replaying it.
    """

    rate_limited: list[str] = Field(default_factory=list)
    tenant: TenantPolicy | None = None
    caps: Caps = Field(default_factory=Caps, description="caps on fan-out, nesting and refs")
    local: list[str] = Field(
        default_factory=list,
        description='workers whose calls run as local activities ("execution": "local", '
        "served by the answering process, AIWORKER_LOCAL_ACTIVITIES on)",
    )
    inline_items: int = Field(
        default=DEFAULT_FOREACH_INLINE_ITEMS,
        ge=0,
        description="a for_each over more items keeps its outputs by reference "
        "(AIWORKER_FOREACH_INLINE_ITEMS)",
    )
    specs: dict[str, RecordedSpec] = Field(
        default_factory=dict,
        description="the specs of the workers the run names (RunConfigCall.record) that the "
        "answering process knows, without their examples; empty in a run started before",
    )
    known: list[str] = Field(
        default_factory=list,
        description="every worker the answering process knows, only when it does not know "
        "one the run names (the run's refusal names them)",
    )
    problems: list[str] | None = Field(
        default=None,
        description="what the full check of RunConfigCall.pipeline found (empty: none); "
        "None: not checked here (a run that checks its pipeline itself)",
    )
