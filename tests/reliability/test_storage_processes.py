"""Large payloads cross worker processes through S3 only.

Two real ``aiworker worker`` processes on the session's Temporal server:
A polls only the scrape queue, B only the pipelines queue (the pipeline
workflow, the validator, the limiter). Both, the test's client and the
``aiworker artifacts`` process each have a data directory of their own and
share nothing but the Temporal server and an S3 bucket (moto on loopback).

A pipeline scrapes a 5 MB page (in A) and validates the scraped data in a
later step (in B): B's workflow can only build the validator's input by
decoding A's result from S3, and the validator only sees the whole body by
decoding B's scheduled input from S3. Then A is killed with SIGKILL and a
second pipeline waits until a fresh A' serves it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from fixtures.big_site import BODY_CHARS, BigSite, big_site  # noqa: F401  (module fixture)
from fixtures.s3 import MotoS3, moto_s3  # noqa: F401  (module fixture)
from support.payloads import SMALL_HISTORY_BYTES, aiworker, client_for, history_bytes
from support.procs import WorkerProcess, worker_env
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from aiworker.activities.errors import AccessDeniedError
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.schemas.protocol import WorkerResponse
from aiworker.workers.client.client import start_pipeline
from aiworker.workers.process.resources import artifact_store, close_connections

AIWORKER = str(Path(sys.executable).parent / "aiworker")
PREFIX = "aiw"
PIPELINE_TIMEOUT = 120
# Any local file this large would be (part of) a 5 MB payload that skipped S3.
LOCAL_FILE_LIMIT = 1_000_000


@dataclass
class Deployment:
    """Worker processes A (scrape queue) and B (pipelines queue), each with its own data dir.

    ``settings`` are the test client's (queue suffix, store, a data dir of its own).
    """

    env: WorkflowEnvironment
    settings: Settings
    client: Client
    moto: MotoS3
    bucket: str
    tmp: Path
    procs: dict[str, WorkerProcess] = field(default_factory=dict)
    started: int = 0

    def process_env(self, name: str) -> dict[str, str]:
        """A process's environment: the shared server, queues and bucket; its own data dir."""
        out = worker_env(self.env.client, self.settings, self.tmp / name / "data")
        out.update(self.moto.aws_env())
        out["AIWORKER_ARTIFACT_STORE"] = self.settings.artifact_store
        # The validator as an activity, not a local one: its 5 MB input is then one more
        # hop through the store and the history that these tests follow.
        out["AIWORKER_LOCAL_ACTIVITIES"] = "false"
        return out

    def start(self, role: str, queue: str) -> WorkerProcess:
        """Start (or replace) the process in ``role``, polling only ``queue``."""
        self.started += 1
        name = f"{role}{self.started}"
        proc = WorkerProcess(
            [AIWORKER, "worker", "-q", queue], self.process_env(name), self.tmp / f"{name}.log"
        )
        self.procs[role] = proc
        return proc

    def data_dirs(self) -> list[Path]:
        return [self.settings.data_dir, *(p / "data" for p in self.tmp.iterdir() if p.is_dir())]

    def outputs(self) -> str:
        return "\n".join(f"--- {r} ({p.pid}):\n{p.output()}" for r, p in self.procs.items())


@pytest_asyncio.fixture(scope="module")
async def deployment(
    env: WorkflowEnvironment, moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployment]:
    bucket = f"aiw-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    tmp = tmp_path_factory.mktemp("storage-procs")
    settings = Settings(
        data_dir=tmp / "client",
        task_queue_suffix=f"-t{uuid.uuid4().hex[:10]}",
        artifact_store=f"s3://{bucket}/{PREFIX}",
    )
    procs_dir = tmp / "procs"
    procs_dir.mkdir()
    d = Deployment(env, settings, client_for(env, settings), moto_s3, bucket, procs_dir)
    d.start("a", names.SCRAPE_QUEUE)
    d.start("b", names.PIPELINES_QUEUE)
    try:
        yield d
    finally:
        for p in d.procs.values():
            p.terminate()
            p.close()
        await close_connections()


@pytest.fixture
def retire() -> Iterator[list[WorkerProcess]]:
    """Processes a test replaced; closed (by PID) when the test ends."""
    out: list[WorkerProcess] = []
    yield out
    for p in out:
        p.close()


def scrape_and_check(tenant: str, url: str) -> dict[str, Any]:
    """Scrape ``url`` (queue A), then validate the whole scraped body (queue B)."""
    spec = {
        "fields": {"title": {"selector": "h1", "required": True}, "body": {"selector": ".body"}}
    }
    body = {"type": "string", "minLength": BODY_CHARS, "maxLength": BODY_CHARS}
    return {
        "name": "cross-process-big",
        "tenant": tenant,
        "steps": [
            {
                "id": "scrape",
                "worker": "web-scrape",
                "input": {"url": url, "extraction_spec": spec},
            },
            {
                "id": "check",
                "worker": "validator",
                "depends_on": ["scrape"],
                "input": {
                    "data": "${{ steps.scrape.outputs.data }}",
                    "schema": {
                        "type": "object",
                        "required": ["title", "body"],
                        "properties": {"body": body},
                    },
                },
            },
        ],
        "output": {
            "title": "${{ steps.scrape.outputs.data.title }}",
            "valid": "${{ steps.check.outputs.valid }}",
            "bytes": "${{ steps.scrape.outputs.source.bytes }}",
        },
    }


async def start(d: Deployment, pipeline: dict[str, Any]) -> WorkflowHandle[Any, PipelineResult]:
    started = await start_pipeline(d.client, d.settings, pipeline)
    return d.client.get_workflow_handle(started.id, result_type=PipelineResult)


async def finish(d: Deployment, handle: WorkflowHandle[Any, PipelineResult]) -> PipelineResult:
    try:
        return await asyncio.wait_for(handle.result(), PIPELINE_TIMEOUT)
    except TimeoutError:
        raise AssertionError(f"pipeline did not finish; the workers said:\n{d.outputs()}") from None


def activities(history: Any) -> dict[str, dict[str, Any]]:
    """Per activity type: its scheduled input, started identity/attempt and completed result."""
    by_event: dict[int, dict[str, Any]] = {}
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            by_event[e.event_id] = {"type": a.activity_type.name, "input": a.input}
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = e.activity_task_started_event_attributes
            by_event[a.scheduled_event_id].update(identity=a.identity, attempt=a.attempt)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a = e.activity_task_completed_event_attributes
            by_event[a.scheduled_event_id]["result"] = a.result
    return {v["type"]: v for v in by_event.values()}


def external_size(payloads: Any) -> int:
    """The size the history's external reference names (0 when the payload is inline)."""
    return sum(x.size_bytes for p in payloads.payloads for x in p.external_payloads)


def workflow_task_identities(history: Any) -> set[str]:
    return {
        e.workflow_task_completed_event_attributes.identity
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    }


def big_local_files(d: Deployment) -> list[Path]:
    return [
        p
        for root in d.data_dirs()
        if root.exists()
        for p in root.rglob("*")
        if p.is_file() and p.stat().st_size > LOCAL_FILE_LIMIT
    ]


async def test_five_mb_result_written_by_one_process_is_read_by_another_through_s3(
    deployment: Deployment, big_site: BigSite, moto_s3: MotoS3
) -> None:
    d = deployment
    a, b = d.procs["a"], d.procs["b"]
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    handle = await start(d, scrape_and_check(tenant, big_site.url))
    result = await finish(d, handle)

    # B's validator saw A's whole body; the client (a third data dir) reads the full result.
    assert result.status == "succeeded", (result, d.outputs())
    page = big_site.page
    assert result.output == {"title": "Big page", "valid": True, "bytes": len(page)}
    assert len(result.steps["scrape"].outputs["data"]["body"]) == BODY_CHARS
    assert result.steps["check"].outputs == {"valid": True, "errors": []}

    # Who did what: A ran the scrape, B the validator and every workflow task.
    history = await handle.fetch_history()
    acts = activities(history)
    scrape, check = acts[names.WEB_SCRAPE], acts[names.VALIDATOR]
    assert scrape["identity"].startswith(f"{a.pid}@"), scrape["identity"]
    assert check["identity"].startswith(f"{b.pid}@"), check["identity"]
    assert workflow_task_identities(history) == {check["identity"]}
    assert scrape["attempt"] == check["attempt"] == 1

    # Each 5 MB hop is a reference in a small history: A's result, B's validator input
    # and the pipeline's result.
    assert history_bytes(history) < SMALL_HISTORY_BYTES
    assert external_size(scrape["result"]) > BODY_CHARS
    assert external_size(check["input"]) > BODY_CHARS
    (completed,) = [
        e.workflow_execution_completed_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    ]
    assert external_size(completed.result) > BODY_CHARS

    # Through S3 only: nothing of that size in any process's data directory.
    assert big_local_files(d) == []
    s3 = moto_s3.client()
    listed = s3.list_objects_v2(Bucket=d.bucket, Prefix=f"{PREFIX}/_payloads/")
    payloads = [o for o in listed.get("Contents", []) if o["Size"] > BODY_CHARS]
    assert len(payloads) >= 3, payloads

    # The raw page is an artifact under the tenant's key.
    digest = hashlib.sha256(page).hexdigest()
    key = f"{PREFIX}/{tenant}/{digest[:2]}/{digest}"
    assert s3.head_object(Bucket=d.bucket, Key=key)["ContentLength"] == len(page)
    (artifact,) = result.steps["scrape"].artifacts
    assert artifact["uri"] == f"s3://{d.bucket}/{key}"

    # Lineage, from a fourth process with a data dir of its own.
    cli_env = d.process_env("cli")
    (record,) = json.loads(aiworker(cli_env, "artifacts", handle.id, "--json"))
    assert (record["uri"], record["sha256"], record["size_bytes"], record["media_type"]) == (
        artifact["uri"],
        digest,
        len(page),
        "text/html",
    )
    assert (record["tenant"], record["worker_id"], record["workflow_id"]) == (
        tenant,
        names.WEB_SCRAPE,
        handle.id,
    )
    assert (record["step_id"], record["attempt"]) == ("scrape", 1)
    (response,) = await d.client.data_converter.decode(
        list(scrape["result"].payloads), [WorkerResponse]
    )
    assert record["trace_id"] == response.observability.trace_id
    assert record["trace_id"] and len(record["trace_id"]) == 32

    # The store answers the owner and refuses another tenant, before any request.
    store = artifact_store(d.settings)
    assert await store.get(tenant, artifact["uri"]) == page
    with pytest.raises(AccessDeniedError):
        await store.get(f"globex-{uuid.uuid4().hex[:6]}", artifact["uri"])


async def test_a_killed_scrape_process_is_replaced_and_the_next_pipeline_is_served(
    deployment: Deployment,
    big_site: BigSite,
    retire: list[WorkerProcess],
) -> None:
    d = deployment
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    small = {
        "name": "small-scrape",
        "tenant": tenant,
        "steps": [
            {
                "id": "scrape",
                "worker": "web-scrape",
                "input": {
                    "url": big_site.small_url,
                    "extraction_spec": {"fields": {"title": {"selector": "h1"}}},
                },
            }
        ],
        "output": {"title": "${{ steps.scrape.outputs.data.title }}"},
    }
    first = d.procs["a"]
    handle = await start(d, small)
    result = await finish(d, handle)
    assert result.status == "succeeded", (result, d.outputs())
    assert result.output == {"title": "Small page"}
    served = activities(await handle.fetch_history())[names.WEB_SCRAPE]
    assert served["identity"].startswith(f"{first.pid}@")

    assert first.kill() == -signal.SIGKILL
    retire.append(first)
    # Queued while no process polls the scrape queue; served once A' is up.
    handle = await start(d, scrape_and_check(tenant, big_site.url))
    replacement = d.start("a", names.SCRAPE_QUEUE)
    result = await finish(d, handle)
    assert result.status == "succeeded", (result, d.outputs())
    assert result.output == {"title": "Big page", "valid": True, "bytes": len(big_site.page)}
    acts = activities(await handle.fetch_history())
    assert acts[names.WEB_SCRAPE]["identity"].startswith(f"{replacement.pid}@")
    assert acts[names.VALIDATOR]["identity"].startswith(f"{d.procs['b'].pid}@")
    assert big_local_files(d) == []
