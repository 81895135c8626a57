"""The tenant registry: which tenants exist and what each may do.

Without a registry a tenant is whatever a pipeline or a request names (its
name must still match :data:`~aiworker.schemas.names.TENANT_PATTERN`). With
one (``AIWORKER_TENANTS_FILE``, a JSON file read once at process start by
:mod:`aiworker.config.settings`), a tenant must be listed, and its entry is
a ceiling on what the operator's other settings and the pipeline spec allow:
where two limits apply, the tighter wins.

The file::

    {"tenants": {
        "acme": {
            "rate_limits": {"web-scrape": "60/min"},
            "concurrency": 5,
            "budget": {"max_tokens": 200000, "max_external_calls": 1000,
                       "deadline_seconds": 3600},
            "workers": ["web-scrape", "validator", "publish"],
            "egress_allow": ["example.com"],
            "fairness_weight": 2,
            "highest_priority": 2
        },
        "globex": {}
    }}

Where each ceiling takes effect: rate ceilings in the limiter
(``activities/limits.py`` ``rate_limit_for``); the concurrency ceiling, the
budget ceiling and the allowed workers at pipeline start, from the
``run-config`` answer (``workflows/pipeline_limits.py``); allowed workers and
the egress allow-list again in the worker runtime for every call
(``activities/runtime.py``), so a call that does not come from a pipeline is
held to them too. The fairness weight goes with the tenant as the Temporal
fairness key of its pipelines, and the highest priority caps the one they start
with (``schemas/priority.py``, in every client that starts a pipeline: ``aiworker
run``, ``aiworker serve``, schedules).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import Field, field_validator

from aiworker.schemas.agent import agent_calls
from aiworker.schemas.base import Model
from aiworker.schemas.files import load_json_model
from aiworker.schemas.names import (
    LLM_AGENT,
    PRIORITY_HIGHEST,
    PRIORITY_LOWEST,
    TENANT_PATTERN,
    VALIDATOR,
)
from aiworker.schemas.pipeline import Budget, PipelineSpec
from aiworker.schemas.problems import Problem
from aiworker.schemas.spec import parse_rate

TenantName = Annotated[str, Field(pattern=TENANT_PATTERN)]
WorkerId = Annotated[str, Field(min_length=1, max_length=128)]
Domain = Annotated[str, Field(min_length=1, max_length=253)]

# Bounds of the file: an operator's list, not a database.
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_TENANTS = 10_000
MAX_ENTRIES = 500


class TenantsFileError(ValueError):
    """The tenants file cannot be used; the message names the file and the field."""


def domain_list(domains: Iterable[str]) -> tuple[str, ...]:
    """An egress allow-list: lower-case domains without a leading dot; an IP
    address is refused (the allow-lists name domains, the policy checks addresses)."""
    out: list[str] = []
    for d in domains:
        d = d.strip().lower().lstrip(".")
        try:
            ipaddress.ip_address(d)
        except ValueError:
            out.append(d)
            continue
        raise ValueError(f"{d!r}: the egress allow-list takes domains, not addresses")
    return tuple(out)


def tighter_rate(
    a: tuple[int, float] | None, b: tuple[int, float] | None
) -> tuple[int, float] | None:
    """The tighter of two rates ``(limit, period seconds)``: fewer calls per second."""
    if a is None or b is None:
        return a if b is None else b
    return a if a[0] / a[1] <= b[0] / b[1] else b


_N = TypeVar("_N", int, float, Decimal)


def _lower(a: _N | None, b: _N | None) -> _N | None:
    return a if b is None else b if a is None else min(a, b)


def tighten_budget(budget: Budget, ceiling: Budget) -> Budget:
    """``budget`` held under ``ceiling``: each limit the tighter of the two."""
    tokens = _lower(budget.max_tokens, ceiling.max_tokens)
    calls = _lower(budget.max_external_calls, ceiling.max_external_calls)
    return Budget(
        max_tokens=None if tokens is None else int(tokens),
        max_external_calls=None if calls is None else int(calls),
        deadline_seconds=_lower(budget.deadline_seconds, ceiling.deadline_seconds),
        max_cost_usd=_lower(budget.max_cost_usd, ceiling.max_cost_usd),
    )


class TenantPolicy(Model):
    """One tenant's ceilings. Every field is optional: ``{}`` is a known tenant
    held only to the operator's other settings."""

    rate_limits: dict[WorkerId, str] = Field(
        default_factory=dict,
        max_length=MAX_ENTRIES,
        description='per worker, like AIWORKER_RATE_LIMITS: {"web-scrape": "60/min"}',
    )
    concurrency: int | None = Field(
        default=None, ge=1, le=10_000, description="pipelines of this tenant running at once"
    )
    budget: Budget = Field(
        default_factory=Budget, description="ceilings on every pipeline's budget"
    )
    workers: list[WorkerId] | None = Field(
        default=None,
        max_length=MAX_ENTRIES,
        description="the workers this tenant may call; absent: all",
    )
    egress_allow: list[Domain] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ENTRIES,
        description="domains its calls may reach, on top of AIWORKER_EGRESS_ALLOW",
    )
    fairness_weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        allow_inf_nan=False,
        description="its share under contention: the weight of its Temporal fairness key",
    )
    highest_priority: int | None = Field(
        default=None,
        ge=PRIORITY_HIGHEST,
        le=PRIORITY_LOWEST,
        description="the most urgent priority its pipelines start with (1 most urgent, 5 "
        "least): a spec asking for more starts at this one; absent: any",
    )

    quote_accept_above_usd: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="a start whose cost quote (p95, US dollars) is above this needs an explicit "
        "accept (`aiworker run --accept-quote`, `accept_quote` on the front door and the "
        "client); absent: no quote is taken at start",
    )

    @field_validator("rate_limits")
    @classmethod
    def _rates(cls, v: dict[str, str]) -> dict[str, str]:
        for rate in v.values():
            parse_rate(rate)
        return v

    @field_validator("egress_allow")
    @classmethod
    def _domains(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else list(domain_list(v))

    def rate(self, worker_id: str) -> tuple[int, float] | None:
        """The tenant's rate ceiling for ``worker_id``, if it has one."""
        text = self.rate_limits.get(worker_id)
        return None if text is None else parse_rate(text)

    def may_use(self, worker_id: str) -> bool:
        """Whether the tenant may call ``worker_id``."""
        return self.workers is None or worker_id in self.workers


def refusal(tenant: str, worker_id: str) -> str:
    """The one wording of a worker a tenant may not call (check, run start, agent)."""
    return f"tenant {tenant!r} may not call worker {worker_id!r}"


def refused_workers(
    spec: PipelineSpec, policy: TenantPolicy, *, steps: bool = True, agents: bool = True
) -> list[Problem]:
    """Each worker a step would call that ``spec``'s tenant may not call under
    ``policy``: with ``steps``, its own, its fallback and the validator of its
    ``validate`` loop; with ``agents``, for an ``llm-agent`` step ``llm-call`` (each
    model turn) and every tool its ``tools`` name, literally or from the pipeline's
    ``inputs`` (a tool from a step's outputs is checked when the agent runs)."""
    problems = []
    for i, step in enumerate(spec.steps):
        uses: list[tuple[str, str | None]] = []
        if steps:
            uses += [("worker", step.worker if step.wait is None else None)]
            uses += [("fallback", step.fallback)]
            if step.validate_ is not None:
                uses.append(("validate", VALIDATOR))
        if agents and step.worker == LLM_AGENT:
            tools = step.input.get("tools") if isinstance(step.input, dict) else None
            uses += list(agent_calls(tools, spec.inputs))
        for field, worker in uses:
            if worker is not None and not policy.may_use(worker):
                message = refusal(spec.tenant, worker)
                if field == "worker" and worker != step.worker:
                    message += f" (each model turn of {step.worker!r} is a call of it)"
                problems.append(Problem(step.id, field, message, index=i))
    return problems


class TenantRegistry(Model):
    """The tenants file: every tenant there is, by name."""

    tenants: dict[TenantName, TenantPolicy] = Field(max_length=MAX_TENANTS)

    def policy(self, tenant: str) -> TenantPolicy | None:
        """``tenant``'s entry, or None when it is not configured."""
        return self.tenants.get(tenant)


def load_tenants(path: Path) -> TenantRegistry:
    """Read and check a tenants file; ``TenantsFileError`` names the file and field."""
    return load_json_model(path, MAX_FILE_BYTES, TenantRegistry, TenantsFileError)
