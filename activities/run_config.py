"""The run config: what a pipeline run takes from its process at its start.

One local activity, ``run-config`` (:class:`RunConfigActivities`), answered
before any step and recorded in the run's history, so the run decides from the
record on any process and on replay: which of its workers have a rate limit for
its tenant, the tenant's registry entry, the process's caps and local workers,
the specs of every worker it names (this process's catalog first, the live
registry's for workers other processes serve), and every problem of the
pipeline (:func:`full_check`): the run's one check, with what compiles (schemas,
patterns, selectors, each step's input against its worker's contract), which a
workflow task must not compile; the workflow task itself only parses the model
within the hard ceilings.
The workflow side is ``workflows/pipeline_limits.py`` (``load_run_config``); the
models are ``schemas/limits.py`` (``RunConfig``, ``RunConfigCall``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from temporalio import activity

from aiworker.activities.errors import InvalidInputError
from aiworker.activities.limits import LiveSpecs, rate_limit_for
from aiworker.activities.tenancy import check_redrive_tenant
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.caps import Caps
from aiworker.schemas.limits import RunConfig, RunConfigCall
from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline
from aiworker.schemas.spec import WorkerSpec, recorded


def full_check(
    pipeline: dict[str, Any], workers: Mapping[str, WorkerSpec | None], caps: Caps
) -> list[str]:
    """Every problem of ``pipeline`` against ``workers`` (the recorded specs, and
    the ids the answering process knows as ``None``) and the process's ``caps``:
    the one check of a run, made by its ``run-config`` local activity
    (``RunConfigCall.pipeline``) so that what compiles never holds a workflow task
    past the SDK's deadlock detector. An unknown worker is a problem naming every
    worker in ``workers``."""
    try:
        parse_pipeline(pipeline, workers, caps)
    except PipelineSpecError as e:
        return e.problems
    return []


class RunConfigActivities:
    """The ``run-config`` activity: a run's config and the specs it records."""

    def __init__(
        self,
        settings: Settings,
        specs: Mapping[str, WorkerSpec],
        local: Iterable[str] = (),
        live_specs: LiveSpecs | None = None,
    ) -> None:
        """``specs``: this process's catalog. ``local``: the workers this process can
        run as local activities (registered beside the pipeline workflows), which
        every run config it answers names. ``live_specs``: what the live worker
        registry knows (the worker process passes it), asked only when a run names
        a worker this process does not know.
        """
        self._settings = settings
        self._specs = specs
        self._local = sorted(set(local))
        self._live_specs = live_specs

    def specs_for(
        self, worker_ids: Iterable[str], live: Mapping[str, WorkerSpec] | None = None
    ) -> dict[str, WorkerSpec]:
        """The specs a run records of ``worker_ids``: those this process knows, else
        those the live registry publishes (``live``), each as
        :func:`~aiworker.schemas.spec.recorded` (without examples); an unknown id is
        left out (the run refuses it, naming :meth:`known_workers`).

        The one place a run's specs come from: this process's catalog (built-ins,
        plugins, spec files: ``WorkerSet.specs``) first, so a process that has a
        worker decides as it would call it; the registry only fills in workers
        other processes serve. Every run records whatever this returns.
        """
        more = live or {}
        out = {}
        for w in sorted(set(worker_ids)):
            spec = self._specs.get(w) or more.get(w)
            if spec is not None:
                out[w] = recorded(spec)
        return out

    def known_workers(self, live: Mapping[str, WorkerSpec] | None = None) -> list[str]:
        """Every worker id :meth:`specs_for` could answer: for a refusal's message,
        and what a run records whose agent's tools are known only as it runs
        (``RunConfigCall.record_all``)."""
        return sorted({*self._specs, *(live or {})})

    async def _live(self, wanted: Iterable[str], everything: bool) -> Mapping[str, WorkerSpec]:
        """The live registry's specs, read only when a run names a worker this process
        does not know (or records every worker); none when there is no registry."""
        if self._live_specs is None:
            return {}
        if not everything and all(w in self._specs for w in wanted):
            return {}
        return await self._live_specs()

    @activity.defn(name=names.RUN_CONFIG)
    async def run_config(self, call: RunConfigCall) -> RunConfig:
        """Which of a pipeline's workers have a rate limit for its tenant, the
        tenant's registry entry, the process's caps and, when the call names
        them (``record``), the specs of the workers the run calls (asked once,
        before any step; the run decides from these recorded specs).

        Raises ``invalid_input`` (not retried) when a registry is configured and
        does not know the tenant, or when the run redrives another tenant's run.
        """
        registry = self._settings.tenants
        policy = registry.policy(call.tenant) if registry is not None else None
        try:
            if registry is not None and policy is None:
                raise InvalidInputError(
                    f"tenant {call.tenant!r} is not configured "
                    f"(AIWORKER_TENANTS_FILE lists {len(registry.tenants)} tenants)",
                    field="tenant",
                )
            if call.resume_from is not None:
                await check_redrive_tenant(activity.client(), call.resume_from, call.tenant)
        except InvalidInputError as e:
            raise e.to_application_error(activity.info().activity_type) from None
        specs: dict[str, WorkerSpec] = {}
        known: list[str] = []
        local = self._local
        if call.record is not None:
            live = await self._live(call.record, call.record_all)
            wanted = self.known_workers(live) if call.record_all else call.record
            specs = self.specs_for(wanted, live)
            if any(w not in specs for w in call.record):
                known = self.known_workers(live)
            # local only as the recorded specs say (execution "local")
            local = [w for w in local if w in specs and specs[w].execution == "local"]
        problems = None
        if call.pipeline is not None:
            workers = {**dict.fromkeys(known), **specs}
            # in a thread: the check is CPU work (bounded by the caps on schemas and
            # patterns), and this activity shares its event loop with the process's others
            problems = await asyncio.to_thread(
                full_check, call.pipeline, workers, self._settings.caps
            )
        return RunConfig(
            rate_limited=sorted(
                w
                # a run whose agent's tools are known only as it runs records every
                # worker: any of them may be a tool, which waits for its permit
                for w in set(call.workers) | (set(specs) if call.record_all else set())
                if rate_limit_for(self._settings, {**specs, **self._specs}, w, call.tenant)
                is not None
            ),
            tenant=policy,
            caps=self._settings.caps,
            local=local,
            inline_items=self._settings.foreach_inline_items,
            specs=specs,
            known=known,
            problems=problems,
        )
