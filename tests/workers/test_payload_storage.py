"""Large payloads through the SDK's external storage, end to end on a real Temporal server.

A 5 MB scrape result round-trips through S3 (moto on loopback) with a small
history; the default file store carries payloads over a lowered threshold;
``aiworker artifacts`` lists the lineage the run recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from fixtures.big_site import BODY_CHARS, BigSite, big_site  # noqa: F401  (module fixture)
from fixtures.s3 import MotoS3, moto_s3  # noqa: F401  (module fixture)
from support.payloads import (
    SMALL_HISTORY_BYTES,
    aiworker,
    client_for,
    external_sizes,
    history_bytes,
    stack_settings,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
)
from temporalio.testing import WorkflowEnvironment

from aiworker.activities.errors import AccessDeniedError
from aiworker.config.settings import Settings, SettingsError
from aiworker.schemas.pipeline import PipelineResult
from aiworker.schemas.protocol import WorkerResponse
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.failures import TolerantFailureConverter
from aiworker.workers.process.payload_storage import FILE_DRIVER, PrefixedS3StorageDriver
from aiworker.workers.process.resources import build_tools, close_connections, s3_connection


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


async def test_five_mb_scrape_result_goes_through_s3_with_a_small_history(
    s3_stack: Stack,
    big_site: BigSite,
    moto_s3: MotoS3,
) -> None:
    url, page = big_site.url, big_site.page
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
    for conv in (data_converter(None), data_converter(Settings(payload_threshold_bytes=1000))):
        # pydantic's converter (JSON it refuses is invalid_input: test_pipeline_caps.py)
        assert issubclass(
            conv.payload_converter_class, pydantic_data_converter.payload_converter_class
        )
        assert isinstance(conv.failure_converter, TolerantFailureConverter)
    assert data_converter(None).external_storage is None
    conv = data_converter(Settings(payload_threshold_bytes=1000))
    assert conv.external_storage is not None
    assert conv.external_storage.payload_size_threshold == 1000
    assert issubclass(conv.payload_converter_class, pydantic_data_converter.payload_converter_class)


async def test_s3_payload_references_hold_the_prefix_they_were_written_under(
    moto_s3: MotoS3, tmp_path: Path
) -> None:
    """A reader configured with another prefix (a moved store, a rolling deploy that
    changes it) still reads what was written: the reference names the whole key."""
    bucket = f"aiw-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)

    def converter(store: str, name: str) -> DataConverter:
        return data_converter(
            Settings(data_dir=tmp_path / name, artifact_store=store, payload_threshold_bytes=1000)
        )

    value = {"text": "x" * 5000}
    payloads = await converter(f"s3://{bucket}/old", "writer").encode([value])
    (key,) = [o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert key.startswith("old/_payloads/v0/")
    for store in (f"s3://{bucket}/new", f"s3://{bucket}", f"s3://{bucket}/old"):
        assert await converter(store, "reader").decode(payloads, [dict]) == [value], store

    # A reference written before the prefix was recorded: read under the reader's own prefix.
    digest = key.rsplit("/", 1)[1]
    legacy = StorageDriverClaim(
        {
            "bucket": bucket,
            "key": key.removeprefix("old/_payloads/"),
            "hash_algorithm": "sha256",
            "hash_value": digest,
        }
    )
    driver = PrefixedS3StorageDriver(s3_connection(), bucket, "old/_payloads/")
    (payload,) = await driver.retrieve(StorageDriverRetrieveContext(), [legacy])
    assert hashlib.sha256(payload.SerializeToString()).hexdigest() == digest
    await close_connections()
