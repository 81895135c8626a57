"""The bench's per-pipeline counts (bench/counts.py) against real histories from the
session's Temporal server, its targets block and its profile summary. No timing."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload, Payloads, SearchAttributes
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import (
    HistoryEvent,
    MarkerRecordedEventAttributes,
    UpsertWorkflowSearchAttributesEventAttributes,
    WorkflowExecutionStartedEventAttributes,
)
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

# bench/ lives at the repository root, outside the installed package; appended,
# so nothing installed is shadowed by the root's folders
sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.bare_workflow import BareBenchWorkflow, noop
from bench.counts import count_history, median_counts, pipeline_counts
from bench.profile import ROOT, summarize
from bench.report import targets


def _json_len(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


@workflow.defn(name="BenchCountsParent")
class ParentWorkflow:
    """Runs the bare chain-1 as a child: its history must be counted too."""

    @workflow.run
    async def run(self, shape: dict[str, Any]) -> dict[str, Any]:
        return await workflow.execute_child_workflow(
            BareBenchWorkflow.run,
            shape,
            id=f"{workflow.info().workflow_id}/child",
            execution_timeout=timedelta(seconds=30),
        )


def _worker(client: Client, queue: str) -> Worker:
    return Worker(
        client,
        task_queue=queue,
        workflows=[BareBenchWorkflow, ParentWorkflow],
        activities=[noop],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )


async def test_bare_chain_counts_from_a_real_history(client: Client) -> None:
    queue = f"bench-counts-{uuid.uuid4().hex[:8]}"
    shapes = {1: {"kind": "chain", "n": 1}, 3: {"kind": "chain", "n": 3}}
    async with _worker(client, queue):
        ids = {}
        for n, shape in shapes.items():
            ids[n] = f"bench-counts-{n}-{uuid.uuid4().hex[:8]}"
            await client.execute_workflow(BareBenchWorkflow.run, shape, id=ids[n], task_queue=queue)
    one = await pipeline_counts(client, ids[1])
    # start -> schedule the activity (task 1), its result -> complete (task 2)
    assert one["workflow_tasks"] == 2
    assert one["workflow_tasks_failed"] == 0
    assert one["activities"] == 1
    assert one["local_activities"] == 0
    assert one["workflows"] == 1 and one["child_workflows"] == 0
    # started, 2 x (task scheduled, started, completed), activity scheduled,
    # started, completed, workflow completed
    assert one["events"] == 11
    payloads = [shapes[1], {"i": 0}, {"ok": True}, {"ok": True}]
    assert one["payload_bytes"] == sum(_json_len(p) for p in payloads)
    assert one["payload_bytes_by_kind"]["data"] == one["payload_bytes"]
    assert one["payload_bytes_by_event"] == {
        "ActivityTaskCompleted": _json_len({"ok": True}),
        "ActivityTaskScheduled": _json_len({"i": 0}),
        "WorkflowExecutionCompleted": _json_len({"ok": True}),
        "WorkflowExecutionStarted": _json_len(shapes[1]),
    }
    history = await client.get_workflow_handle(ids[1]).fetch_history()
    assert one["history_bytes"] > one["payload_bytes"]
    assert one["largest_history_bytes"] == one["history_bytes"]
    assert one == {**count_history(history), "largest_history_bytes": one["history_bytes"]}

    three = await pipeline_counts(client, ids[3])
    assert (three["workflow_tasks"], three["activities"], three["events"]) == (4, 3, 23)


async def test_child_workflow_histories_are_counted(client: Client) -> None:
    queue = f"bench-counts-{uuid.uuid4().hex[:8]}"
    wid = f"bench-parent-{uuid.uuid4().hex[:8]}"
    async with _worker(client, queue):
        await client.execute_workflow(
            ParentWorkflow.run, {"kind": "chain", "n": 1}, id=wid, task_queue=queue
        )
    total = await pipeline_counts(client, wid)
    parent = count_history(await client.get_workflow_handle(wid).fetch_history())
    child = count_history(await client.get_workflow_handle(f"{wid}/child").fetch_history())
    assert total["workflows"] == 2
    assert total["child_workflows"] == parent["child_workflows"] == 1
    assert total["activities"] == child["activities"] == 1
    assert total["workflow_tasks"] == parent["workflow_tasks"] + child["workflow_tasks"]
    assert total["payload_bytes"] == parent["payload_bytes"] + child["payload_bytes"]
    assert total["largest_history_bytes"] == max(parent["history_bytes"], child["history_bytes"])


def test_payload_bytes_by_kind() -> None:
    def p(data: bytes) -> Payload:
        return Payload(metadata={"encoding": b"json/plain"}, data=data)

    events = [
        HistoryEvent(
            event_id=1,
            event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
            workflow_execution_started_event_attributes=WorkflowExecutionStartedEventAttributes(
                input=Payloads(payloads=[p(b"12345")]),
                search_attributes=SearchAttributes(indexed_fields={"A": p(b"ab")}),
            ),
        ),
        HistoryEvent(
            event_id=2,
            event_type=EventType.EVENT_TYPE_MARKER_RECORDED,
            marker_recorded_event_attributes=MarkerRecordedEventAttributes(
                marker_name="core_local_activity",
                details={"data": Payloads(payloads=[p(b"xyz")])},
            ),
        ),
        HistoryEvent(
            event_id=3,
            event_type=EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
            upsert_workflow_search_attributes_event_attributes=(
                UpsertWorkflowSearchAttributesEventAttributes(
                    search_attributes=SearchAttributes(indexed_fields={"B": p(b"cdef")})
                )
            ),
        ),
    ]
    counts = count_history(WorkflowHistory("w", events))
    assert counts["payload_bytes_by_kind"] == {
        "data": 5,
        "markers": 3,
        "headers": 0,
        "memo": 0,
        "search_attributes": 6,
    }
    assert counts["payload_bytes"] == 14
    assert counts["local_activities"] == 1
    assert counts["events"] == 3


def test_median_counts_takes_the_low_median_and_a_missing_key_as_zero() -> None:
    runs = [
        {"workflow_tasks": 5, "by": {"a": 1, "b": 2}},
        {"workflow_tasks": 4, "by": {"a": 3}},
        {"workflow_tasks": 5, "by": {"a": 2, "b": 2}},
    ]
    assert median_counts(runs) == {"workflow_tasks": 5, "by": {"a": 2, "b": 2}}


def test_targets_block_says_met_from_the_figures() -> None:
    out = {
        "throughput": [
            {"case": "chain-1", "ratio": 0.95},
            {"case": "chain-3", "ratio": 0.7},
        ],
        "idle_latency_ratio_vs_bare": {"chain-1": 1.05, "chain-3": 1.2},
        "for_each": {
            "items": 100000,
            "largest_history_bytes": 1_500_000,
            "peak_worker_rss_mb": 400.0,
            "rss_before_mb": 200.0,
        },
    }
    block = targets(out)
    # throughput chain-1, chain-3; idle chain-1, chain-3; history 1.5 MB; RSS 2.0x idle
    engine = block["checks"][:6]
    assert [c["met"] for c in engine] == [True, False, True, False, True, False]
    assert engine[-1]["value"] == 2.0
    # issue 29's and 31's parts did not run: unknown (null), never met
    assert [c["met"] for c in block["checks"][6:]] == [None] * 11
    assert block["all_met"] is False
    # a skipped for_each: its targets are unknown (null), never met
    block = targets({"for_each": {"skipped": "bench.foreach not present"}})
    assert [c["met"] for c in block["checks"][:2]] == [None, None]
    assert block["all_met"] is False


def test_like_against_like_targets_come_from_each_shapes_own_keys() -> None:
    out = {
        "throughput": [{"case": "chain-1", "ratio": 0.95}],
        "throughput_ratio_regular": {"chain-1": 0.91, "fanout-5": 0.62},
        "idle_latency_ratio_regular": {"chain-1": 1.12},
        "worker_cpu_ratio_regular": {"chain-1": 1.29, "fanout-5": 1.93},
        "throughput_ratio_local": {"chain-1": 0.57},
    }
    checks = {c["target"]: c for c in targets(out)["checks"]}
    met = {t: c["met"] for t, c in checks.items() if t.startswith(("regular ", "local "))}
    assert met == {
        "regular chain-1: throughput ratio >= 0.9": True,
        "regular fanout-5: throughput ratio >= 0.9": False,
        "regular chain-1: idle p50 ratio <= 1.1": False,
        "regular chain-1: worker CPU per pipeline ratio <= 1.3": True,
        "regular fanout-5: worker CPU per pipeline ratio <= 1.3": False,
        "local chain-1: throughput ratio to bare local >= 1.0": False,
    }
    # the first headline's target is its own (validator steps local against bare regular)
    assert checks["throughput chain-1: ratio >= 0.9"]["met"] is True


def test_targets_against_what_users_would_pick_instead() -> None:
    out = {
        "limiter": {"permits_per_s": 436.4, "grant_p95_ms": 120.0},
        "crawl": {"ratio": 0.25, "field_agreement": 1.0},
        "scrape_ratio_vs_direct": 0.91,
        "article_ratio_vs_direct": 0.85,
        "llm_stream": {"ratio": 0.97, "first_token_overhead_ms": 38.2},
        "browser_hostile": {"ratio": 1.004},
        "slowloris": {"ratio": 43.9},
        "check_caps": {"during_ms": {"p50": 52.0, "p95": 77.5}},
    }
    checks = {c["target"].split(":")[0] + ":" + str(c["limit"]): c for c in targets(out)["checks"]}
    met = {
        k: c["met"]
        for k, c in checks.items()
        if not k.startswith(("throughput", "idle", "for_each"))
    }
    assert met == {
        "limiter:200.0": True,
        "limiter:100.0": False,  # p95 120 ms is over 100 ms
        "crawl:0.8": False,
        "crawl:1.0": True,
        "single page:0.9": True,
        "article mode:0.9": False,
        "llm stream:0.95": True,
        "llm stream:50.0": True,
        "front door:100.0": True,  # /healthz p95 77.5 ms during a check
        "hostile page:1.1": True,
        "slow clients:1.1": False,  # descriptors held after the burst: 43.9x
    }


def test_profile_summary_groups_frames_by_module() -> None:
    ours = f"{ROOT}/workflows/pipeline.py"
    site = "/venv/lib/python3.11/site-packages"
    raw = "\n".join(
        [
            f"run ({site}/temporalio/worker/_workflow.py);step ({ours});validate "
            f"({site}/pydantic/main.py) 3",
            f"run ({site}/temporalio/worker/_workflow.py);step ({ours}) 1",
            f"_import ({site}/temporalio/worker/workflow_sandbox/_importer.py) 4",
            "",
        ]
    )
    s = summarize(raw)
    assert s["samples"] == 8
    assert s["self_by_group"] == {
        "temporalio sandbox importer": 0.5,
        "pydantic": 0.375,
        "aiworker.workflows": 0.125,
    }
    assert s["inclusive_by_group"]["aiworker.workflows"] == 0.5
    assert s["inclusive_by_group"]["temporalio (other)"] == 0.5
    assert s["inclusive_by_function"]["workflows/pipeline.py:step"] == 0.5
