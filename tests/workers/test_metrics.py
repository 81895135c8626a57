"""/metrics, /healthz and /readyz: a real Prometheus scraping a worker, the SDK's
metrics on the same port, readiness that follows the Temporal connection, and
a real ``aiworker worker`` process.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import running_stack
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support.pipelines import one_step_pipeline
from support.waiting import wait_until
from telemetry_helpers import tclient, telemetry, workflow_id  # noqa: F401 - pytest fixtures
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.devstack.devserver import free_port
from aiworker.workers.process.probes import Health, MetricsServer
from aiworker.workers.process.telemetry import Telemetry
from aiworker.workers.process.worker import watch_connection

P95 = "histogram_quantile(0.95, sum by (le) (rate(aiworker_request_duration_seconds_bucket[1m])))"


async def _get(url: str, **params: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as http:
        return await http.get(url, params=params)


async def _query(base: str, promql: str) -> list[dict[str, Any]]:
    r = await _get(f"{base}/api/v1/query", query=promql)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


async def _run_pipeline(client: Client, queue: str) -> PipelineResult:
    return await client.execute_workflow(
        names.PIPELINE_WORKFLOW,
        one_step_pipeline("scraped"),
        id=workflow_id("scraped"),
        task_queue=queue,
        result_type=PipelineResult,
    )


async def test_prometheus_scrapes_worker_and_p95_is_a_number(
    tclient: Client, settings: Settings, telemetry: Telemetry, tmp_path: Path
) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip(reason="the prometheus binary is not installed (apt-get install -y prometheus)")
    async with running_stack(tclient, settings) as stack:
        registry = stack.metrics.registry
        telemetry.register(registry)
        health = Health()
        server = MetricsServer("127.0.0.1", 0, health, registry).start()
        prom_port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: aiworker\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{server.port}']\n"
        )
        log = (tmp_path / "prometheus.log").open("w")
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{prom_port}"
        try:
            # Prometheus up and scraping the worker before anything runs, so
            # the histogram's buckets increase between scrapes.
            async def scraping() -> bool:
                try:
                    up = await _query(base, 'up{job="aiworker"}')
                    if up and up[0]["value"][1] == "1":
                        return True
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
                return False

            await wait_until(scraping, "Prometheus to scrape the worker", timeout=30, interval=0.25)

            async def finite_p95() -> dict[str, Any] | None:
                await _run_pipeline(tclient, stack.pipelines_queue)
                result = await _query(base, P95)
                if result and math.isfinite(float(result[0]["value"][1])):
                    return dict(result[0])
                return None

            sample = await wait_until(
                finite_p95, "histogram_quantile to return a number", timeout=60, interval=0.25
            )
            p95: float | None = float(sample["value"][1])
            assert p95 is not None, "histogram_quantile never returned a number"
            assert 0 < p95 <= 120

            # The SDK's own metrics, and the pipelines counter PipelineWorkflow
            # records through the SDK's meter, reach the same scrape.
            pipelines: list[dict[str, Any]] = []
            sdk: list[dict[str, Any]] = []

            async def counted() -> bool:
                nonlocal pipelines, sdk
                pipelines = await _query(
                    base, 'sum(aiworker_pipelines_total{status="succeeded",pipeline="scraped"})'
                )
                sdk = await _query(base, "sum(temporal_workflow_completed_total)")
                return bool(pipelines and sdk and float(pipelines[0]["value"][1]) >= 2)

            await wait_until(counted, "two pipelines counted", timeout=10, interval=0.25)
            assert pipelines and float(pipelines[0]["value"][1]) >= 2
            assert sdk and float(sdk[0]["value"][1]) >= 2
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            log.close()
            server.stop()


async def test_healthz_and_readyz_follow_polling_and_connection(env: WorkflowEnvironment) -> None:
    health = Health()
    server = MetricsServer("127.0.0.1", 0, health).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert (await _get(f"{base}/healthz")).status_code == 200
        r = await _get(f"{base}/readyz")
        assert r.status_code == 503 and "starting" in r.text
        health.set(True, "polling aiworker-pipelines")
        r = await _get(f"{base}/readyz")
        assert r.status_code == 200 and "polling aiworker-pipelines" in r.text

        # A server that does not answer: not ready, and the reason says so without
        # naming the internal address (that goes to the log).
        dead = await Client.connect(
            f"127.0.0.1:{free_port()}", lazy=True, data_converter=pydantic_data_converter
        )
        stop = asyncio.Event()
        watch = asyncio.create_task(watch_connection(dead, health, stop, probe_timeout=2))
        try:
            await wait_until(lambda: not health.ready, "not ready", timeout=10)
        finally:
            stop.set()
            await watch
        r = await _get(f"{base}/readyz")
        assert r.status_code == 503 and "cannot reach Temporal" in r.text
        assert "127.0.0.1" not in r.text

        # The real server answers: ready again.
        stop = asyncio.Event()
        watch = asyncio.create_task(watch_connection(env.client, health, stop, interval=0.1))
        try:
            await wait_until(lambda: health.ready, "ready again", timeout=10)
        finally:
            stop.set()
            await watch
        assert (await _get(f"{base}/readyz")).status_code == 200
        assert (await _get(f"{base}/nope")).status_code == 404
    finally:
        server.stop()


async def test_worker_process_serves_probes_metrics_and_json_logs(
    env: WorkflowEnvironment, tclient: Client, tmp_path: Path
) -> None:
    secret = "sk-proc-" + uuid.uuid4().hex
    port = free_port()
    suffix = f"-p{uuid.uuid4().hex[:10]}"
    proc_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_", "OTEL_"))
    }
    proc_env.update(
        AIWORKER_METRICS_PORT=str(port),
        AIWORKER_METRICS_HOST="127.0.0.1",
        AIWORKER_TASK_QUEUE_SUFFIX=suffix,
        AIWORKER_DATA_DIR=str(tmp_path / "data"),
        AIWORKER_LLM_API_KEY=secret,
        AIWORKER_LLM_MODEL="test-model",
        AIWORKER_SHUTDOWN_GRACE_SECONDS="2",
        # the validator step asks a LimiterWorkflow (in this process) for a permit,
        # queued (a limit this tight leases no blocks: activities/limits.block_size)
        AIWORKER_RATE_LIMITS="validator:*=100/min",
        TEMPORAL_NAMESPACE=env.client.namespace,
    )
    stderr = (tmp_path / "worker.stderr").open("w+")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiworker.workers.cli.main",
            "worker",
            "--address",
            env.client.service_client.config.target_host,
        ],
        env=proc_env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        async def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "worker.stderr").read_text()
            try:
                return (await _get(f"{base}/readyz")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(ready, "the worker to become ready", timeout=60, interval=0.25)
        assert (await _get(f"{base}/healthz")).status_code == 200

        result = await _run_pipeline(tclient, names.PIPELINES_QUEUE + suffix)
        assert result.status == "succeeded"
        # and one that fails: what the UI counts under Failures, and the
        # dashboard's Failures panel queries, is the SDK's counter on this /metrics
        broken = {**one_step_pipeline("scraped")}
        broken["steps"] = [{**broken["steps"][0], "worker": "no-such-worker"}]
        with pytest.raises(WorkflowFailureError) as failure:
            await tclient.execute_workflow(
                names.PIPELINE_WORKFLOW,
                broken,
                id=workflow_id("broken"),
                task_queue=names.PIPELINES_QUEUE + suffix,
                result_type=PipelineResult,
            )
        assert isinstance(failure.value.cause, ApplicationError)
        assert failure.value.cause.type == "invalid_input"

        async def completed_counted() -> str:
            text = (await _get(f"{base}/metrics")).text
            both = ("temporal_workflow_completed_total{", "temporal_workflow_failed_total{")
            return text if all(series in text for series in both) else ""

        text = await wait_until(
            completed_counted, "the completed and failed counters", timeout=10, interval=0.25
        )
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

        def value(name: str, **labels: str) -> float:
            return sum(
                v
                for (n, ls), v in samples.items()
                if n == name and labels.items() <= dict(ls).items()
            )

        assert value("aiworker_requests_total", worker_id="validator", status="succeeded") == 1
        assert value("aiworker_request_duration_seconds_count", worker_id="validator") == 1
        assert value("temporal_workflow_completed_total") >= 1
        assert value("temporal_workflow_failed_total", workflow_type="PipelineWorkflow") == 1
        assert value("aiworker_pipelines_total", status="succeeded", pipeline="scraped") == 1
        # the SDK's own activity metrics (the validator runs as a local activity)
        assert (
            value("temporal_activity_execution_latency_seconds_count")
            + value("temporal_local_activity_execution_latency_seconds_count")
        ) >= 1
        assert value("aiworker_limiter_wait_seconds_count", kind="rate") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise
        stderr.close()
    assert code == 0
    lines = (tmp_path / "worker.stderr").read_text().splitlines()
    assert lines
    for line in lines:
        doc = json.loads(line)
        assert {"ts", "level", "event"} <= doc.keys()
    assert secret not in "\n".join(lines)
    calls = [json.loads(x) for x in lines if '"worker_call"' in x]
    assert calls and calls[0]["trace_id"] == result.trace_id


@workflow.defn(name="MeterProbeWorkflow", sandboxed=False)
class MeterProbeWorkflow:
    """Records through the workflow's metric meter, as PipelineWorkflow does."""

    @workflow.run
    async def run(self, status: str) -> None:
        workflow.metric_meter().create_counter("aiworker_test_probe", "probe").add(
            1, {"status": status}
        )
        workflow.metric_meter().create_histogram_float(
            "aiworker_test_probe_seconds", "probe", "s"
        ).record(0.02)


async def test_workflow_metric_meter_reaches_metrics(tclient: Client, telemetry: Telemetry) -> None:
    registry = CollectorRegistry()
    telemetry.register(registry)
    queue = f"meter-probe-{uuid.uuid4().hex[:8]}"
    async with Worker(tclient, task_queue=queue, workflows=[MeterProbeWorkflow]):
        for status in ("succeeded", "failed", "succeeded"):
            await tclient.execute_workflow(
                MeterProbeWorkflow.run, status, id=workflow_id("probe"), task_queue=queue
            )

    def value(name: str, **labels: str) -> float:
        return sum(
            s.value
            for family in registry.collect()
            for s in family.samples
            if s.name == name
            and s.labels.get("task_queue") == queue
            and labels.items() <= s.labels.items()
        )

    await wait_until(
        lambda: value("aiworker_test_probe_total") >= 3, "three probes", timeout=10, interval=0.25
    )
    assert value("aiworker_test_probe_total", status="succeeded") == 2
    assert value("aiworker_test_probe_total", status="failed") == 1
    assert value("aiworker_test_probe_seconds_count") == 3
    assert value("aiworker_test_probe_seconds_bucket", le="0.025") == 3
    assert value("aiworker_test_probe_seconds_bucket", le="0.01") == 0
    # The SDK's own counters come through the same collector.
    assert value("temporal_workflow_completed_total", workflow_type="MeterProbeWorkflow") == 3


@workflow.defn(name="BuggyProbeWorkflow", sandboxed=False)
class BuggyProbeWorkflow:
    """A bug in workflow code: every workflow task fails (the run stays running)."""

    @workflow.run
    async def run(self) -> None:
        raise RuntimeError("a bug in workflow code")


async def test_failed_workflow_tasks_reach_metrics(tclient: Client, telemetry: Telemetry) -> None:
    # The alert AiworkerWorkflowTaskFailing (deploy/monitoring) queries this series.
    registry = CollectorRegistry()
    telemetry.register(registry)
    queue = f"buggy-probe-{uuid.uuid4().hex[:8]}"

    def failed(**labels: str) -> float:
        return sum(
            s.value
            for family in registry.collect()
            for s in family.samples
            if s.name == "temporal_workflow_task_execution_failed_total"
            and s.labels.get("task_queue") == queue
            and labels.items() <= s.labels.items()
        )

    async with Worker(tclient, task_queue=queue, workflows=[BuggyProbeWorkflow]):
        handle = await tclient.start_workflow(
            BuggyProbeWorkflow.run, id=workflow_id("buggy"), task_queue=queue
        )
        try:
            await wait_until(lambda: failed() >= 1, "a failed workflow task counted", timeout=20)
        finally:
            await handle.terminate("test over")
    assert failed(workflow_type="BuggyProbeWorkflow", failure_reason="WorkflowError") >= 1
