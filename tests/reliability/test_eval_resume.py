"""An eval run whose worker process is killed with SIGKILL mid-run resumes on a
fresh process and calls each item once.

``aiworker eval run`` (its own process, waiting on the run) runs a hand-written
dataset of five tickets through a candidate prompt spec, one item at a time, on
a real ``aiworker worker`` process whose model is the session's local model
behind a loopback proxy. The proxy answers the first two items and holds the
third until the test has killed the worker process; a second process takes over.
Temporal times the lost attempt of item 3 out and retries it; items 1 and 2 are
in the eval's history and are not called again; items 4 and 5 are called once.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from support.loopback import Exchange, serve
from support.procs import WorkerProcess, run_cli_module, worker_env
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.devstack.modelserver import MODEL_NAME, ModelServer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "prompts"
SUBJECTS = [f"Ticket number {n}" for n in range(1, 6)]
HELD = SUBJECTS[2]


def worker(env: dict[str, str], log: Path) -> WorkerProcess:
    return WorkerProcess([sys.executable, "-m", "aiworker.workers.cli.main", "worker"], env, log)


@pytest.mark.timeout(240)
async def test_an_eval_killed_mid_run_resumes_and_calls_each_item_once(
    client: Client, settings: Settings, tmp_path: Path, local_model: ModelServer
) -> None:
    target = f"http://{local_model.host}:{local_model.port}"
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    release = threading.Event()

    def forward(ex: Exchange) -> None:
        body = ex.body()
        subject = ""
        if ex.method == "POST":
            last = json.loads(body)["messages"][-1]["content"]
            m = re.search(r"Subject: (Ticket number \d)", last)
            subject = m.group(1) if m else ""
            with lock:
                seen[subject] += 1
                held = subject == HELD and seen[subject] == 1
            if held:  # the first attempt of item 3 waits until its process is dead
                release.wait(60)
        request = urllib.request.Request(
            target + ex.target,
            data=body if ex.method == "POST" else None,
            headers={"Content-Type": "application/json"},
            method=ex.method,
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                status, raw = int(r.status), r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        ex.send(status, raw, "application/json")

    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(EXAMPLES / "classify-ticket.json", specs)
    spec = json.loads((EXAMPLES / "classify-ticket.json").read_text("utf-8"))
    spec["version"] = "1.1"
    # a lost attempt is retried after 30 + 5 s; 30 s, not less: on a loaded machine a
    # call to the shared local model may take several seconds, and must not time out
    spec["constraints"]["timeout_seconds"] = 30
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps(spec), "utf-8")
    dataset = tmp_path / "tickets.jsonl"
    dataset.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"t{n}",
                    "worker": "classify-ticket",
                    "input": {"subject": s, "body": "The export button does nothing."},
                    "output": {"category": "bug", "priority": "normal", "summary": "Broken."},
                }
            )
            + "\n"
            for n, s in enumerate(SUBJECTS, start=1)
        ),
        "utf-8",
    )
    report = tmp_path / "report.json"
    first: WorkerProcess | None = None
    second: WorkerProcess | None = None
    with serve(forward) as proxy:
        env = worker_env(client, settings, tmp_path / "data")
        env.update(
            AIWORKER_WORKER_SPECS=str(specs),
            AIWORKER_LLM_BASE_URL=proxy.base_url + "/v1",
            AIWORKER_LLM_MODEL=MODEL_NAME,
        )
        try:
            first = worker(env, tmp_path / "worker-1.log")
            command = asyncio.create_task(
                asyncio.to_thread(
                    run_cli_module,
                    ["eval", "run", str(dataset), "--candidate", str(candidate),
                     "--concurrency", "1", "--compare", "summary=ignore",
                     "--report", str(report)],
                    env,
                    timeout=200,
                )
            )  # fmt: skip

            def third_held() -> bool:
                with lock:
                    return seen[HELD] == 1

            await wait_until(third_held, "item 3 to reach the model", timeout=120)
            with lock:
                before_kill = dict(seen)
            assert first.kill() == -signal.SIGKILL
            release.set()  # the lost attempt's reply goes nowhere
            second = worker(env, tmp_path / "worker-2.log")
            done = await command
            assert done.returncode == 0, done.stderr + done.stdout + second.output()
            assert second.terminate() == 0, second.output()
        finally:
            release.set()
            for p in (first, second):
                if p is not None:
                    p.close()

    # the items done before the kill never reach the model again after it
    assert {s: seen[s] for s in SUBJECTS[:2]} == {s: before_kill[s] for s in SUBJECTS[:2]}
    doc = json.loads(report.read_text("utf-8"))
    assert [i["id"] for i in doc["items"]] == ["t1", "t2", "t3", "t4", "t5"]
    assert all(i["candidate"]["status"] == "succeeded" for i in doc["items"])
    workflow_id = doc["eval"]["workflow_id"]
    events = (await client.get_workflow_handle(workflow_id).fetch_history()).events
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled == [names.EVAL_CALL] * 5
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    # each item reached the model once per attempt Temporal made, no more: item 3
    # twice (its lost attempt and the retry). On a quiet machine every other item
    # takes one attempt; a loaded one may time out a slow model call, which Temporal
    # retries, and the count at the model follows it.
    assert dict(seen) == dict(zip(SUBJECTS, attempts, strict=True))
    assert attempts[2] >= 2
