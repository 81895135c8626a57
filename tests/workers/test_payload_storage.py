"""Large payloads through the SDK's external storage, end to end on a real Temporal server.

A 5 MB scrape result round-trips through S3 (moto on loopback) with a small
history; the default file store carries payloads over a lowered threshold;
``aiworker artifacts`` lists the lineage the run recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from fixtures.s3 import MotoS3, moto_s3  # noqa: F401  (module fixture)
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.errors import AccessDeniedError
from schemas.pipeline import PipelineResult
from schemas.protocol import WorkerResponse
from schemas.settings import Settings, SettingsError
from workers.payload_storage import FILE_DRIVER
from workers.temporal_client import data_converter
from workers.tools import build_tools, close_connections

BODY_CHARS = 5_000_000
# A history whose 5 MB result went out of band: a few KB of events and references.
SMALL_HISTORY_BYTES = 64 * 1024


def big_page() -> bytes:
    filler = ("lorem ipsum " * (BODY_CHARS // 12 + 1))[:BODY_CHARS]
    return (
        "<!doctype html><html><head><title>big</title></head><body><h1>Big page</h1>"
        f'<div class="body">{filler}</div></body></html>'
    ).encode()


@pytest.fixture(scope="module")
def big_site() -> Iterator[tuple[str, bytes]]:
    page = big_page()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body, status = (page, 200) if self.path == "/big" else (b"no", 404)
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/big", page
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def stack_settings(tmp: Path, **kw: Any) -> Settings:
    return Settings(
        data_dir=tmp / "data",
        task_queue_suffix=f"-t{uuid.uuid4().hex[:10]}",
        metrics_port=0,
        allow_private_networks=True,
        shutdown_grace_seconds=5,
        **kw,
    )


def client_for(env: WorkflowEnvironment, settings: Settings) -> Client:
    """A client on the session's server with the converter ``settings`` configure."""
    return Client(
        env.client.service_client,
        namespace=env.client.namespace,
        data_converter=data_converter(settings),
    )


@pytest_asyncio.fixture(scope="module")
async def s3_stack(
    env: WorkflowEnvironment,
    moto_s3: MotoS3,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    bucket = f"aiw-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    settings = stack_settings(
        tmp_path_factory.mktemp("s3stack"), artifact_store=f"s3://{bucket}/aiw"
    )
    tools = build_tools(settings)
    try:
        async with running_stack(client_for(env, settings), settings, tools=tools) as stack:
            yield stack
    finally:
        await tools["fetch_url"].aclose()
        await close_connections()


def history_bytes(history: Any) -> int:
    return sum(e.ByteSize() for e in history.events)


def external_sizes(history: Any) -> list[int]:
    """Sizes of the payloads that went out of band, as the history's references say."""
    sizes = []
    for e in history.events:
        for attrs in (
            e.activity_task_completed_event_attributes,
            e.workflow_execution_completed_event_attributes,
        ):
            for p in attrs.result.payloads:
                sizes += [x.size_bytes for x in p.external_payloads]
    return sizes


async def test_five_mb_scrape_result_goes_through_s3_with_a_small_history(
    s3_stack: Stack,
    big_site: tuple[str, bytes],
    moto_s3: MotoS3,
) -> None:
    url, page = big_site
    # A tenant of its own: web-scrape's per-tenant rate limit is not shared with other tests.
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    spec = {
        "fields": {"title": {"selector": "h1", "required": True}, "body": {"selector": ".body"}}
    }
    pipeline = {
        "name": "big-scrape",
        "tenant": tenant,
        "steps": [
            {"id": "scrape", "worker": "web-scrape", "input": {"url": url, "extraction_spec": spec}}
        ],
        "output": {"title": "${{ steps.scrape.outputs.data.title }}"},
    }
    handle = await s3_stack.start(pipeline)
    result: PipelineResult = await handle.result()
    assert result.status == "succeeded", result
    step = result.steps["scrape"]
    assert step.outputs is not None
    assert len(step.outputs["data"]["body"]) == BODY_CHARS
    assert result.output == {"title": "Big page"}

    history = await handle.fetch_history()
    assert history_bytes(history) < SMALL_HISTORY_BYTES
    big = [s for s in external_sizes(history) if s > BODY_CHARS]
    assert len(big) == 2  # the activity's result and the pipeline's result, each by reference

    settings = s3_stack.settings
    bucket = settings.artifact_store.split("/")[2]
    s3 = moto_s3.client()
    payload_keys = [
        o["Key"]
        for o in s3.list_objects_v2(Bucket=bucket, Prefix="aiw/_payloads/v0/").get("Contents", [])
    ]
    assert len(payload_keys) >= 2
    digest = hashlib.sha256(page).hexdigest()
    assert s3.head_object(Bucket=bucket, Key=f"aiw/{tenant}/{digest[:2]}/{digest}")[
        "ContentLength"
    ] == (len(page))

    # The raw page is the tenant's: another tenant cannot read it through the same tool.
    (artifact,) = step.artifacts
    store = s3_stack.runtime.tools["artifact_store"]
    assert await store.get(tenant, artifact["uri"]) == page
    with pytest.raises(AccessDeniedError):
        await store.get("globex", artifact["uri"])

    # Lineage, as an operator sees it.
    env = {**os.environ, "AIWORKER_ARTIFACT_STORE": settings.artifact_store}
    env["AIWORKER_DATA_DIR"] = str(settings.data_dir)
    out = aiworker(env, "artifacts", handle.id, "--json")
    (record,) = json.loads(out)
    assert record["uri"] == artifact["uri"]
    assert (record["sha256"], record["size_bytes"], record["media_type"]) == (
        digest,
        len(page),
        "text/html",
    )
    assert (record["tenant"], record["worker_id"], record["workflow_id"]) == (
        tenant,
        "web-scrape",
        handle.id,
    )
    assert (record["step_id"], record["attempt"]) == ("scrape", 1)
    # The attempt's own trace id, as its response reports it (read back through S3).
    (completed,) = [
        e.activity_task_completed_event_attributes
        for e in history.events
        if e.HasField("activity_task_completed_event_attributes")
    ]
    (response,) = await s3_stack.client.data_converter.decode(
        list(completed.result.payloads), [WorkerResponse]
    )
    assert record["trace_id"] == response.observability.trace_id
    assert record["trace_id"] and len(record["trace_id"]) == 32
    table = aiworker(env, "artifacts", handle.id)
    header, row = table.splitlines()
    assert header.split()[:4] == ["step", "att", "worker", "tenant"]
    assert row.split()[:7] == [
        "scrape",
        "1",
        "web-scrape",
        tenant,
        str(len(page)),
        "text/html",
        digest[:16],
    ]


def aiworker(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


async def test_default_file_store_carries_payloads_over_the_threshold(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path, payload_threshold_bytes=16 * 1024)
    data = {"rows": [{"i": i, "text": "x" * 100} for i in range(1000)]}  # ~110 KB
    pipeline = {
        "name": "file-payloads",
        "tenant": "acme",
        "inputs": {"data": data},
        "steps": [
            {
                "id": "check",
                "worker": "validator",
                "input": {"data": "${{ inputs.data }}", "schema": {"type": "object"}},
            }
        ],
        "output": {"data": "${{ inputs.data }}"},
    }
    async with running_stack(client_for(env, settings), settings) as stack:
        handle = await stack.start(pipeline)
        result: PipelineResult = await handle.result()
    assert result.status == "succeeded"
    assert result.output == {"data": data}
    history = await handle.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.input.payloads[0].external_payloads[0].size_bytes > 100_000
    assert history_bytes(history) < 32 * 1024
    stored = list((settings.data_dir / "payloads" / "default").glob("*/*"))
    assert stored, "payloads went to <data_dir>/payloads/<namespace>/"
    assert FILE_DRIVER.encode() in started.input.payloads[0].data


def test_store_settings() -> None:
    s = Settings.from_env({"AIWORKER_ARTIFACT_STORE": "s3://bkt/some/prefix/"})
    assert s.artifact_store == "s3://bkt/some/prefix"
    assert Settings.from_env({}).artifact_store == "file"
    assert Settings.from_env({}).payload_threshold_bytes == 256 * 1024
    assert Settings.from_env({"AIWORKER_PAYLOAD_THRESHOLD_BYTES": "0"}).payload_threshold_bytes == 0
    for bad in ("gs://b", "s3://", "s3:///x"):
        with pytest.raises(SettingsError, match="AIWORKER_ARTIFACT_STORE"):
            Settings.from_env({"AIWORKER_ARTIFACT_STORE": bad})
    with pytest.raises(SettingsError, match="AIWORKER_PAYLOAD_THRESHOLD_BYTES"):
        Settings.from_env({"AIWORKER_PAYLOAD_THRESHOLD_BYTES": "-1"})
    assert data_converter(None) is pydantic_data_converter
    conv = data_converter(Settings(payload_threshold_bytes=1000))
    assert conv.external_storage is not None
    assert conv.external_storage.payload_size_threshold == 1000
    assert conv.payload_converter_class is pydantic_data_converter.payload_converter_class
