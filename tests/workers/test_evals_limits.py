"""An eval run waits for its tenant's rate-limit permits, as a pipeline step does.

Items of a tenant with a tight rate limit on the worker (one call per 2 s) go
through the limiter workflow one by one (each item's reported permit wait comes
from the limiter's ``permit`` signal); an item of a tenant without a limit asks
for none. Real dev server, the built-in validator as the candidate on its own
queue.
"""

from __future__ import annotations

import uuid

from conftest import running_stack
from temporalio.client import Client

from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings, parse_rate_limits
from aiworker.schemas import names
from aiworker.schemas.evals import EvalCandidate, EvalInput, EvalItem, EvalResult


async def test_items_of_a_rate_limited_tenant_wait_for_the_limiters_permits(
    client: Client, settings: Settings
) -> None:
    tenant = f"tight{uuid.uuid4().hex[:6]}"
    s = settings.model_copy(
        update={"rate_limits": tuple(parse_rate_limits(f"{names.VALIDATOR}:{tenant}=1/2s"))}
    )
    spec = load_specs()[names.VALIDATOR]
    ok = {"data": 1, "schema": {"type": "integer"}}
    inp = EvalInput(
        dataset_sha256="0" * 64,
        items=[
            *(EvalItem(id=f"t{i}", input=ok, tenant=tenant) for i in range(3)),
            EvalItem(id="free", input=ok, tenant="default"),
        ],
        candidate=EvalCandidate(mode="queue", spec=spec),
        concurrency=4,
        queue_suffix=s.task_queue_suffix,
    )
    wid = f"eval-limits-{uuid.uuid4().hex[:8]}"
    async with running_stack(client, s):
        result = await client.execute_workflow(
            names.EVAL_WORKFLOW,
            inp,
            id=wid,
            task_queue=s.queue(names.PIPELINES_QUEUE),
            result_type=EvalResult,
        )
        limiter = names.limiter_workflow_id(f"rate:{names.VALIDATOR}:{tenant}", s.task_queue_suffix)
        await client.get_workflow_handle(limiter).describe()  # the tenant's limiter ran
    *tight, free = result.items
    assert [i.status for i in result.items] == ["succeeded"] * 4
    # no limit for the other tenant: no permit asked
    assert free.rate_waited_seconds is None
    # one call per 2 s, all three asked at once: the limiter held two of them back
    waits = sorted(i.rate_waited_seconds or 0.0 for i in tight)
    assert all(i.rate_waited_seconds is not None for i in tight)
    assert waits[1] >= 1.0 and waits[2] >= 3.0, waits
    # the permit asks are in the history: one limiter-acquire per limited item
    history = await client.get_workflow_handle(wid).fetch_history()
    asks = [
        e
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and names.LIMITER_ACQUIRE.encode()
        in e.marker_recorded_event_attributes.details["data"].SerializeToString()
    ]
    assert len(asks) == 3
