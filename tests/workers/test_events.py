"""The live event stream: ``PipelineClient.events`` and ``GET /v1/pipelines/{id}/events``
against the real dev server, real workers, a loopback OpenAI-compatible server
that streams (``fixtures/llm_fakes.py``), and the front door's app served by
uvicorn over real HTTP on loopback.

Checked: every step's events against the run's result and history, the partial
LLM text, resumption with ``Last-Event-ID`` (no gap, no repeat), keep-alives,
the end after ``run_ended``, the tenant check, unknown runs, bad ids, and a
client that stops reading (its stream dropped, the run and the door unaffected).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import uvicorn
from conftest import Stack, running_stack
from fixtures.llm_fakes import SLOW_TEXT, FakeProvider, fake  # noqa: F401 (fake: the fixture)
from support.front_door import KEYS, bearer, door_stack, running_door, write_config
from support.pipelines import pipeline_result
from support.procs import worker_env
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio.client import Client

from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.llm import LanguageModel, load_registry
from aiworker.config.settings import Settings
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.events import Cursor, Event
from aiworker.workers.frontdoor.auth import FrontDoorRateLimiter, KeyRing
from aiworker.workers.frontdoor.events import EventStream, StreamLimits, StreamStats
from aiworker.workers.frontdoor.serve import create_app
from aiworker.workers.frontdoor.service import FrontDoor

GOOD = {"policy": "all", "result": {"title": "fixed by a human"}, "used": [], "failed": []}
STEP_TYPES = {"step_started", "step_progress", "step_ended", "review_awaited"}


async def _garbage(_: dict[str, Any]) -> dict[str, Any]:
    raise fail("invalid_output", "the model returned garbage")


@dataclass
class Live:
    """A worker stack, its pipeline client and a front door app on a loopback port."""

    stack: Stack
    pipelines: PipelineClient
    url: str
    stats: StreamStats
    other_url: str  # a second front door app: another `serve` process's stand-in


def pipeline(*, review: bool = False) -> dict[str, Any]:
    """A validator step, then an llm-call that streams slowly (or an aggregator that
    fails and escalates to review)."""
    last: dict[str, Any] = (
        {
            "id": "draft",
            "worker": "aggregator",
            "input": {"policy": "all", "branches": {}},
            "on_failure": "escalate",
            "review_timeout_seconds": 600,
            "depends_on": ["check"],
        }
        if review
        else {
            "id": "ask",
            "worker": "llm-call",
            "input": {"model": "slow", "prompt": "how do I brew tea?", "stream": True},
            "depends_on": ["check"],
        }
    )
    return {
        "name": "live",
        "tenant": "acme",
        "steps": [
            {
                "id": "check",
                "worker": "validator",
                "input": {"data": {"a": 1}, "schema": {"type": "object"}},
            },
            last,
        ],
        "output": {},
    }


@pytest_asyncio.fixture
async def live(
    tmp_path: Path, fake: FakeProvider, client: Client, settings: Settings
) -> AsyncIterator[Live]:
    uid = uuid.uuid4().hex[:10]
    models = {"slow": {"provider": "openai", "base_url": fake.root + "/v1", "model": f"slow@{uid}"}}
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": models}))
    settings = settings.model_copy(update={"models_file": path})
    lm = LanguageModel(
        load_registry(settings, {}), breakers=BreakerRegistry("provider", failure_threshold=100)
    )
    acts = {"aggregator": standin("aggregator", _garbage)}
    env = write_config(tmp_path)
    keys = KeyRing.load(Path(env["AIWORKER_API_KEYS_FILE"]))
    try:
        async with running_stack(
            client, settings, tools={"language_model": lm}, replace_activities=acts
        ) as stack:
            pipelines = PipelineClient(client, settings)
            door = FrontDoor(pipelines, keys, {}, settings, FrontDoorRateLimiter("10000/min"))
            limits = StreamLimits(keepalive_seconds=0.3, poll_seconds=0.2)
            app = create_app(door, limits)
            other = create_app(
                FrontDoor(
                    PipelineClient(client, settings),
                    keys,
                    {},
                    settings,
                    FrontDoorRateLimiter("10000/min"),
                ),
                limits,
            )
            async with serving(app) as url, serving(other) as other_url:
                yield Live(stack, pipelines, url, app.state.event_streams, other_url)
    finally:
        await lm.aclose()


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn on ``127.0.0.1:<free port>`` for the block."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_until(lambda: server.started, "uvicorn to start")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def key_of(event: Event) -> tuple[int, int]:
    c = Cursor.parse(event.id)
    return (10**18, 0) if c.ended else (c.n, c.t)


async def read_sse(response: httpx.Response) -> tuple[list[Event], int]:
    """The events of a server-sent event stream until it ends, and its keep-alives."""
    events, keepalives = [], 0
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            keepalives += 1
        elif line == "":
            if fields:
                events.append(Event(fields["id"], fields["event"], json.loads(fields["data"])))
            fields = {}
        else:
            name, _, value = line.partition(": ")
            fields[name] = value
    return events, keepalives


async def test_the_sdk_streams_a_runs_events_as_its_history_tells_them(live: Live) -> None:
    handle = await live.pipelines.start(pipeline(), check=False)
    events = [e async for e in live.pipelines.events(handle.id)]
    result = await handle.result()
    assert result.status == "succeeded", result
    # ids only grow; run_ended is last and names the run's status
    keys = [key_of(e) for e in events]
    assert keys == sorted(keys) and len(set(keys)) == len(keys), [e.id for e in events]
    assert events[-1].type == "run_ended" and events[-1].id == "end"
    assert events[-1].data["status"] == "succeeded"
    steps = [(e.type, e.data["step"]) for e in events if e.type in STEP_TYPES]
    # the attempts a step makes show as step_progress between its start and its end
    assert [s for s in steps if s[0] != "step_progress"] == [
        ("step_started", "check"),
        ("step_ended", "check"),
        ("step_started", "ask"),
        ("step_ended", "ask"),
    ], steps
    for e in events:
        if e.type == "step_ended":
            assert e.data["status"] == result.steps[e.data["step"]].status
            assert e.data["attempts"] == result.steps[e.data["step"]].attempts
    # the partial text of the streaming step, before it ended
    texts = [e for e in events if e.type == "llm_text"]
    assert texts, [e.type for e in events]
    assert all(e.data["step"] == "ask" for e in texts)
    assert any(0 < len(e.data["text"]) < len(SLOW_TEXT) for e in texts), texts
    assert all(SLOW_TEXT.startswith(e.data["text"]) for e in texts)
    ended_ask = next(
        i for i, e in enumerate(events) if e.type == "step_ended" and e.data["step"] == "ask"
    )
    assert all(events.index(t) < ended_ask for t in texts)
    # each step event was made by the workflow task the history shows, after its activity
    history = await handle.fetch_history()
    by_id = {e.event_id: e for e in history.events}
    done = [
        e.event_id for e in history.events if e.HasField("activity_task_completed_event_attributes")
    ]
    for e in events:
        if e.type in STEP_TYPES:
            assert by_id[e.data["history_length"]].HasField(
                "workflow_task_started_event_attributes"
            )
    ask_end = next(e for e in events if e.type == "step_ended" and e.data["step"] == "ask")
    assert ask_end.data["history_length"] > max(done)

    # resume after any event: the rest of the step events, none twice, none missing
    # (the run has ended: no heartbeat is left to send as partial text)
    # The validator step runs as a local activity: on a busy machine its attempt may
    # outlast a workflow task (the SDK heartbeats the task), and a replay resolves
    # its marker at the task that scheduled it, so its events' history_length may
    # read earlier after the run ended (docs/events.md). Everything else is equal.
    def comparable(e: Any) -> tuple[str, dict[str, Any]]:
        data = dict(e.data)
        if data.get("step") == "check":
            data.pop("history_length", None)
        return e.type, data

    for k in range(len(events) - 1):
        resumed = [e async for e in live.pipelines.events(handle.id, last_event_id=events[k].id)]
        want = [comparable(e) for e in events[k + 1 :] if e.type != "llm_text"]
        assert [comparable(e) for e in resumed] == want, k
        assert all(key_of(e) > key_of(events[k]) for e in resumed)
    assert [e async for e in live.pipelines.events(handle.id, last_event_id="end")] == []


async def test_the_http_stream_keeps_alive_resumes_and_ends(live: Live) -> None:
    handle = await live.pipelines.start(pipeline(review=True), check=False)
    url = f"{live.url}/v1/pipelines/{handle.id}/events"
    async with httpx.AsyncClient(timeout=60) as http:
        # refusals: no key, another tenant's key, an unknown run, a bad id
        noauth = await http.get(url)
        assert noauth.status_code == 401, noauth.text
        other = await http.get(url, headers=bearer("beta"))
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
        unknown = await http.get(
            f"{live.url}/v1/pipelines/nope-{uuid.uuid4().hex}/events", headers=bearer("ci")
        )
        assert unknown.status_code == 404
        bad = await http.get(url, headers={**bearer("ci"), "Last-Event-ID": "x.y"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"
        assert (
            await http.get(url, headers={**bearer("ci"), "Last-Event-ID": "end"})
        ).status_code == 204

        # a client that never reads, open for the whole run
        idle = socket.create_connection(("127.0.0.1", int(live.url.rsplit(":", 1)[1])))
        idle.sendall(
            f"GET /v1/pipelines/{handle.id}/events HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {KEYS['ci'][1]}\r\n\r\n".encode()
        )
        try:
            # the first connection sees the step await review (and keep-alives while it waits)
            first: list[Event] = []
            keepalives = 0
            async with http.stream("GET", url, params={"access_token": KEYS["ci"][1]}) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                fields: dict[str, str] = {}
                async for line in r.aiter_lines():
                    if line.startswith(":"):
                        keepalives += 1
                    elif line == "" and fields:
                        first.append(
                            Event(fields["id"], fields["event"], json.loads(fields["data"]))
                        )
                        fields = {}
                    elif line:
                        name, _, value = line.partition(": ")
                        fields[name] = value
                    if keepalives >= 2 and any(e.type == "review_awaited" for e in first):
                        break  # the client leaves mid-run
            assert [e.data["step"] for e in first if e.type == "review_awaited"] == ["draft"], (
                first,
                keepalives,
            )
            await wait_until(lambda: live.stats.gone >= 1, "the server to see the client leave")
            # the run goes on: approve the step over HTTP
            review = await http.post(
                f"{live.url}/v1/pipelines/{handle.id}/review",
                headers=bearer("ci"),
                json={"decision": "approve", "outputs": GOOD},
            )
            assert review.status_code == 200, review.text
            # a reconnect with the last id, to another front door, gets the rest, then
            # the stream ends
            async with http.stream(
                "GET",
                url.replace(live.url, live.other_url),
                headers={**bearer("ci"), "Last-Event-ID": first[-1].id},
            ) as r:
                rest, _ = await read_sse(r)
            result = await handle.result()
            assert rest[-1].type == "run_ended" and rest[-1].data["status"] == result.status
            whole = [e async for e in live.pipelines.events(handle.id)]
            assert [(e.type, dict(e.data)) for e in first + rest] == [
                (e.type, dict(e.data)) for e in whole
            ]
            assert ("step_ended", "draft") in [(e.type, e.data.get("step")) for e in rest]
            # the door still answers while the idle client holds its stream
            assert (await http.get(f"{live.url}/healthz")).status_code == 200
        finally:
            idle.close()


async def test_a_client_that_stops_reading_is_dropped_and_the_server_stays_bounded() -> None:
    """Over real HTTP: a source that never ends, a client that never reads."""
    stats = StreamStats()
    limits = StreamLimits(keepalive_seconds=5, buffer_events=8, send_timeout_seconds=0.5)
    made = 0

    closed = False

    async def endless() -> AsyncIterator[Event]:
        nonlocal made, closed
        try:
            while True:
                made += 1
                yield Event(f"{made}.0", "llm_text", {"step": "s", "text": "x" * 2000})
                await asyncio.sleep(0)
        finally:
            closed = True  # what follow() does here: stop its history long-poll

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await EventStream(endless(), limits, stats, "endless")(scope, receive, send)

    async with serving(app) as url:
        port = int(url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            await wait_until(lambda: stats.dropped == 1, lambda: f"a drop ({stats})", timeout=30)
            assert stats.open == 0
            assert closed, "the source was left open"
            made_at_drop = made
            # the source stopped when the buffer filled: it is not read any more
            await asyncio.sleep(0)
            assert made == made_at_drop
            # the server closed the connection: reading drains what was sent, then EOF
            sock.setblocking(False)
            loop = asyncio.get_running_loop()

            async def closed() -> bool:
                try:
                    data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
                except (ConnectionResetError, TimeoutError):
                    return True
                return data == b""

            await wait_until(closed, "the dropped connection to close", interval=0)
        finally:
            sock.close()


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Chromium is not installed: apt-get install chromium (Debian's package)",
)
async def test_the_live_page_shows_the_run_as_its_history_tells_it(live: Live) -> None:
    pytest.importorskip("playwright.async_api", reason="playwright is not installed")
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            chromium_sandbox=os.geteuid() != 0,  # Chromium refuses its sandbox as root
        )
        try:
            page = await browser.new_page()
            handle = await live.pipelines.start(pipeline(), check=False)
            opened = await page.goto(
                f"{live.url}/v1/pipelines/{handle.id}/live#key={KEYS['ci'][1]}"
            )
            # only its own script runs (named by its hash), and it talks only to the door
            assert opened is not None
            csp = opened.headers["content-security-policy"]
            assert "script-src 'sha256-" in csp and "connect-src 'self'" in csp
            # the partial text shows while the step runs
            await page.wait_for_function(
                """() => {
                    const tr = document.querySelector('tr[data-step="ask"]');
                    return tr && tr.dataset.status === "running"
                        && tr.querySelector(".text").textContent.length > 0;
                }""",
                timeout=30_000,
            )
            partial = await page.inner_text('tr[data-step="ask"] .text')
            assert SLOW_TEXT.startswith(partial.strip()), partial
            await page.wait_for_selector('#run-status[data-status="succeeded"]', timeout=60_000)
            result = await handle.result()
            rows = await page.eval_on_selector_all(
                "#steps tr",
                """trs => trs.map(tr => [tr.dataset.step, tr.dataset.status,
                    tr.querySelector(".attempts").textContent])""",
            )
            assert rows == [
                [sid, step.status, str(step.attempts)] for sid, step in result.steps.items()
            ]
            assert await page.inner_text("#run-status") == result.status
            assert await page.inner_text("#note") == "The run ended."
            # a stranger's key shows nothing of the run
            page = await browser.new_page()
            await page.goto(f"{live.url}/v1/pipelines/{handle.id}/live#key=wrong")
            await page.wait_for_selector('#run-status[data-status="unavailable"]')
            assert await page.locator("#steps tr").count() == 0
        finally:
            await browser.close()


async def test_a_real_serve_process_streams_a_run_to_its_end(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    """`aiworker serve` as its own process: a run started over HTTP, streamed to its end."""
    async with door_stack(client, tmp_path / "stack") as stack:
        env = worker_env(stack.client, stack.settings, tmp_path / "data") | write_config(tmp_path)
        async with (
            running_door(env, tmp_path / "serve.log") as door,
            httpx.AsyncClient(base_url=door.url, timeout=60, headers=bearer("ci")) as http,
        ):
            started = await http.post("/v1/pipelines", json=pipeline(review=True))
            assert started.status_code == 201, started.text
            wid = started.json()["workflow_id"]
            async with http.stream("GET", f"/v1/pipelines/{wid}/events") as r:
                seen: list[Event] = []
                fields: dict[str, str] = {}
                async for line in r.aiter_lines():
                    if line == "" and fields:
                        seen.append(
                            Event(fields["id"], fields["event"], json.loads(fields["data"]))
                        )
                        fields = {}
                        if seen[-1].type == "review_awaited":
                            decided = await http.post(
                                f"/v1/pipelines/{wid}/review", json={"decision": "reject"}
                            )
                            assert decided.status_code == 200, decided.text
                    elif line and not line.startswith(":"):
                        name, _, value = line.partition(": ")
                        fields[name] = value
            outcome = (await http.get(f"/v1/pipelines/{wid}/result")).json()
            assert seen[-1].type == "run_ended"
            assert seen[-1].data["status"] == outcome["status"] == "rejected"
            ended = {e.data["step"]: e.data["status"] for e in seen if e.type == "step_ended"}
            assert ended == {sid: s["status"] for sid, s in outcome["steps"].items()}


async def test_a_wait_step_streams_its_wait_and_its_timeout(live: Live) -> None:
    spec = {
        "name": "live-wait",
        "tenant": "acme",
        "steps": [{"id": "sign", "wait": {"schema": {"type": "object"}, "timeout_seconds": 1}}],
        "output": {},
    }
    handle = await live.pipelines.start(spec, check=False)
    events = [e async for e in live.pipelines.events(handle.id)]
    result = await pipeline_result(handle)
    assert [(e.type, e.data.get("step"), e.data.get("status")) for e in events] == [
        ("step_started", "sign", "running"),
        ("step_progress", "sign", "waiting"),  # its token handed out: it waits
        ("step_ended", "sign", result.steps["sign"].status),
        ("run_ended", None, result.status),
    ]
    assert result.steps["sign"].status == "failed"


async def test_a_stream_ends_at_its_max_life_and_resumes_with_last_event_id(
    live: Live, tmp_path: Path
) -> None:
    """``StreamLimits.max_seconds`` (``AIWORKER_SERVE_STREAM_MAX_SECONDS``): a stream
    ends cleanly before its run does (no ``run_ended``), and each reconnect with the
    last id it got continues where it stopped: the events of all its lives are the
    run's, none missing, none twice. The run awaits review until a stream has ended
    by its life, so at least one stream must expire."""
    keys = KeyRing.load(tmp_path / "keys.json")
    door = FrontDoor(
        live.pipelines, keys, {}, live.pipelines.settings, FrontDoorRateLimiter("10000/min")
    )
    limits = StreamLimits(keepalive_seconds=0.3, poll_seconds=0.2, max_seconds=1.0)
    app = create_app(door, limits)
    stats: StreamStats = app.state.event_streams
    handle = await live.pipelines.start(pipeline(review=True), check=False)
    got: list[Event] = []
    lives = 0
    approved = False
    async with serving(app) as url, httpx.AsyncClient(timeout=60) as http:
        for _ in range(300):  # each life is a second; the run ends soon after the review
            headers = bearer("ci") | ({"Last-Event-ID": got[-1].id} if got else {})
            async with http.stream(
                "GET", f"{url}/v1/pipelines/{handle.id}/events", headers=headers
            ) as r:
                assert r.status_code == 200, await r.aread()
                events, _ = await read_sse(r)
            lives += 1
            got += events
            if got and got[-1].type == "run_ended":
                break
            if not approved and any(e.type == "review_awaited" for e in got):
                review = await http.post(
                    f"{url}/v1/pipelines/{handle.id}/review",
                    headers=bearer("ci"),
                    json={"decision": "approve", "outputs": GOOD},
                )
                assert review.status_code == 200, review.text
                approved = True
    assert approved and got and got[-1].type == "run_ended", [e.type for e in got]
    # every life but the last ended by its age, cleanly (the client read to the end);
    # the last may too, when its age came right after it sent run_ended
    assert lives >= 2 and lives - 1 <= stats.expired <= lives, (lives, stats)
    assert stats.dropped == 0, stats
    assert stats.open == 0 and app.state.stream_slots.open(keys.keys[0]) == 0
    whole = [e async for e in live.pipelines.events(handle.id)]
    assert [(e.id, e.type, dict(e.data)) for e in got] == [
        (e.id, e.type, dict(e.data)) for e in whole
    ]
