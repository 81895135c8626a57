"""``aiworker serve`` has telemetry of its own: a span per request, received by a
real OTLP receiver (rotel on loopback), whose trace the SDK's tracing
interceptor carries into the pipeline the request started. The probes are not
traced."""

from __future__ import annotations

from pathlib import Path

import httpx
from support.front_door import bearer, door_stack, running_door, write_config
from support.pipelines import one_step_pipeline
from support.procs import worker_env
from support.rotel import Block, running_rotel
from support.waiting import wait_until
from temporalio.testing import WorkflowEnvironment


async def test_each_request_is_a_span_and_its_pipeline_joins_the_trace(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with door_stack(env.client, tmp_path / "stack") as stack:
        with running_rotel(tmp_path) as rotel:
            await wait_until(rotel.ready, "rotel to listen")
            door_env = worker_env(stack.client, stack.settings, tmp_path / "data")
            door_env |= write_config(tmp_path)
            door_env |= {
                "OTEL_EXPORTER_OTLP_ENDPOINT": rotel.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "200",  # spans out within the test's wait
                "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none",
            }
            async with running_door(door_env, tmp_path / "serve.log") as door:
                async with httpx.AsyncClient(base_url=door.url, timeout=30) as http:
                    assert (await http.get("/healthz")).status_code == 200
                    started = await http.post(
                        "/v1/pipelines", json=one_step_pipeline(), headers=bearer("ci")
                    )
                    assert started.status_code == 201, started.text
                    run_id = started.json()["workflow_id"]
                    refused = await http.get(f"/v1/pipelines/{run_id}")  # no key
                    assert refused.status_code == 401

                def door_spans() -> list[Block]:
                    return [
                        b
                        for b in rotel.blocks("Span")
                        if b.resource.get("service.name") == "aiworker-serve"
                    ]

                def named(name: str) -> list[Block]:
                    return [b for b in door_spans() if b.header.get("Name") == name]

                await wait_until(
                    lambda: (
                        named("POST /v1/pipelines") and named("GET /v1/pipelines/{workflow_id}")
                    ),
                    lambda: (
                        f"the request spans; got {[b.header.get('Name') for b in door_spans()]}"
                    ),
                )
                post = named("POST /v1/pipelines")[0]
                trace_id = post.header["Trace ID"]
                assert post.header.get("Kind") == "SPAN_KIND_SERVER"
                assert post.attributes.get("http.route") == "/v1/pipelines"
                assert "201" in (
                    post.attributes.get("http.response.status_code"),
                    post.attributes.get("http.status_code"),
                )
                # the pipeline's start is a child of the request's span
                await wait_until(
                    lambda: any(
                        b.header.get("Trace ID") == trace_id
                        and b.header.get("Name", "").startswith("StartWorkflow:")
                        for b in door_spans()
                    ),
                    "the pipeline start in the request's trace",
                )
                get = named("GET /v1/pipelines/{workflow_id}")[0]
                assert get.header.get("Status code") != "STATUS_CODE_ERROR"  # a 401 is the client's
                # probes are answered but not traced
                assert not [b for b in door_spans() if "healthz" in b.header.get("Name", "")]
