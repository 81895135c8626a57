"""The live event stream: how soon a step's end reaches a client, and what an open stream costs.

One embedded Temporal server, one ``aiworker worker`` process and one
``aiworker serve`` process, all on loopback, in the same run:

- **delay** (the headline ``ratio``): runs of a chain of validator steps; for
  each run a client reads ``GET /v1/pipelines/{id}/events`` while, beside it,
  the plain way a front end follows a run today polls ``GET /v1/pipelines/{id}``
  once a second (as ``aiworker run`` polls its ``progress`` query). A step's end
  is the server's time of the workflow task that wrote its result (its
  ``step_ended`` event names it: ``history_length``, the event read from the
  history); the delay is when each client first saw the step ended, minus that.
  ``ratio`` = stream delay p50 / polling delay p50 (below 1: the stream is sooner).
- **streams**: one run that waits (its web-scrape step fetches a loopback page
  that never answers), and ``N`` event streams of it held open on the one
  ``serve`` process (keep-alives only); ``rss_per_stream_kib`` = (RSS with N
  open - RSS with one open) / N, and ``ratio_rss_vs_idle`` = RSS with N open / RSS
  with one open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.devserver import stop_child
from aiworker.workers.frontdoor.auth import hash_key
from bench.common import embedded_server, percentiles, standalone, worker_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.loopback import Exchange, serve

_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
KEY = "aiw_bench-events-0123456789abcdefghijkl"
POLL_SECONDS = 1.0
# How long each page of the chain takes to answer.
PAGE_SECONDS = 0.3


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def chain(n: int, site: str) -> dict[str, Any]:
    """``n`` web-scrape steps one after another, each a page that answers after
    :data:`PAGE_SECONDS` (a step is an activity of its own, its end a workflow task)."""
    spec = {"fields": {"t": {"selector": "h1"}}}
    steps = [
        {
            "id": f"s{i}",
            "worker": "web-scrape",
            "input": {"url": f"{site}/page/{i}?r={uuid.uuid4().hex[:8]}", "extraction_spec": spec},
            **({"depends_on": [f"s{i - 1}"]} if i else {}),
        }
        for i in range(n)
    ]
    return {"name": "bench-events", "steps": steps, "output": {}}


def hanging(url: str) -> dict[str, Any]:
    return {
        "name": "bench-events-wait",
        "steps": [
            {
                "id": "fetch",
                "worker": "web-scrape",
                "input": {"url": url, "extraction_spec": {"fields": {"t": {"selector": "h1"}}}},
            }
        ],
        "output": {},
    }


@contextlib.contextmanager
def _proc(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    out = open(log, "wb")
    proc = subprocess.Popen(
        cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        yield proc
    finally:
        stop_child(proc, timeout=20)
        out.close()


async def _listening(proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if m := _LISTENING.search(log.read_text()):
            return int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"aiworker serve exited: {log.read_text()}")
        await asyncio.sleep(0.1)
    raise RuntimeError("aiworker serve did not listen")


async def _stream_seen(http: httpx.AsyncClient, wid: str) -> dict[str, tuple[float, int]]:
    """step -> (wall time its step_ended arrived, its history_length)."""
    seen: dict[str, tuple[float, int]] = {}
    async with http.stream("GET", f"/v1/pipelines/{wid}/events") as r:
        kind = ""
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "step_ended":
                doc = json.loads(line[6:])
                seen[doc["step"]] = (time.time(), int(doc["history_length"]))
    return seen


async def _polled(http: httpx.AsyncClient, wid: str, steps: int) -> dict[str, float]:
    """step -> wall time a once-a-second poll of GET /v1/pipelines/{id} first saw it end."""
    seen: dict[str, float] = {}
    ended = {"succeeded", "failed", "partial", "skipped", "blocked", "cancelled"}
    for _ in range(600):
        r = await http.get(f"/v1/pipelines/{wid}")
        now = time.time()
        progress = r.json().get("progress") or {}
        for sid, step in (progress.get("steps") or {}).items():
            if step.get("status") in ended and sid not in seen:
                seen[sid] = now
        if len(seen) >= steps:
            return seen
        await asyncio.sleep(POLL_SECONDS)
    return seen


async def _delays(client: Client, port: int, site: str, runs: int, steps: int) -> dict[str, Any]:
    stream_ms: list[float] = []
    poll_ms: list[float] = []
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60
    ) as http:
        for k in range(runs + 1):  # the first run warms the worker and the door up
            r = await http.post("/v1/pipelines", json=chain(steps, site))
            r.raise_for_status()
            wid = r.json()["workflow_id"]
            stream, polled = await asyncio.gather(
                _stream_seen(http, wid), _polled(http, wid, steps)
            )
            history = await client.get_workflow_handle(wid).fetch_history()
            at = {e.event_id: e.event_time.ToDatetime().timestamp() for e in history.events}
            if k == 0:
                continue
            for sid, (seen, length) in stream.items():
                ended = at[length]
                stream_ms.append((seen - ended) * 1000)
                if sid in polled:
                    poll_ms.append((polled[sid] - ended) * 1000)
    s, p = percentiles(stream_ms), percentiles(poll_ms)
    return {
        "samples": len(stream_ms),
        "stream_delay_ms": s,
        "polling_delay_ms": p,
        "ratio": round(s["p50"] / p["p50"], 3) if p["p50"] else None,
    }


async def _streams(port: int, site: str, n: int, pid: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        headers=headers,
        timeout=120,
        limits=httpx.Limits(max_connections=n + 10),
    ) as http:
        r = await http.post("/v1/pipelines", json=hanging(site))
        if r.status_code != 201:
            raise RuntimeError(r.text)
        wid = r.json()["workflow_id"]
        opened: list[Any] = []
        stack = contextlib.AsyncExitStack()
        async with stack:

            async def open_one() -> None:
                resp = await stack.enter_async_context(
                    http.stream("GET", f"/v1/pipelines/{wid}/events")
                )
                opened.append(resp)

            await open_one()
            await asyncio.sleep(3)
            idle = _rss_kib(pid)
            for _ in range(n - 1):
                await open_one()
            await asyncio.sleep(6)  # every stream has polled at least once
            held = _rss_kib(pid)
            still = sum(1 for resp in opened if not resp.is_closed)
            await http.post(f"/v1/pipelines/{wid}/review", json={"decision": "reject"})
        return {
            "streams": n,
            "open_at_measure": still,
            "rss_one_stream_kib": idle,
            "rss_n_streams_kib": held,
            "rss_per_stream_kib": round((held - idle) / max(n - 1, 1), 1),
            "ratio_rss_vs_idle": round(held / idle, 3),
        }


async def run(quick: bool = False) -> dict[str, Any]:
    runs, steps, n = (3, 4, 50) if quick else (10, 5, 300)
    stop = threading.Event()

    def page(ex: Exchange) -> None:
        if ex.raw.path == "/robots.txt":
            ex.send(404)
            return
        if ex.raw.path.startswith("/page/"):
            stop.wait(PAGE_SECONDS)
            ex.send(200, b"<html><body><h1>a page</h1></body></html>")
            return
        stop.wait(300)  # the waiting run's page never answers

    with (
        tempfile.TemporaryDirectory(prefix="aiworker-bench-events-") as tmp,
        embedded_server() as server,
        serve(page) as site,
    ):
        folder = Path(tmp)
        suffix = f"bench-events-{uuid.uuid4().hex[:6]}"
        keys = {"keys": [{"name": "bench", "tenant": "bench", "sha256": hash_key(KEY)}]}
        (folder / "keys.json").write_text(json.dumps(keys))
        env = worker_env(
            server.address,
            suffix,
            folder / "data",
            AIWORKER_ALLOW_PRIVATE_NETWORKS="true",
            AIWORKER_API_KEYS_FILE=str(folder / "keys.json"),
            AIWORKER_SERVE_RATE_LIMIT="100000/min",
            # the streams part holds n streams of one key: what a stream costs, not the caps
            AIWORKER_SERVE_MAX_STREAMS_PER_KEY=str(n + 10),
            AIWORKER_SERVE_MAX_STREAMS_PER_TENANT=str(n + 10),
        )
        cli = [sys.executable, "-m", "aiworker.workers.cli.main"]
        log = folder / "serve.log"
        with (
            _proc([*cli, "worker"], env, folder / "worker.log"),
            _proc([*cli, "serve", "--host", "127.0.0.1", "--port", "0"], env, log) as door,
        ):
            port = await _listening(door, log)
            client = await Client.connect(server.address, data_converter=data_converter(None))
            delay = await _delays(client, port, site.base_url, runs, steps)
            held = await _streams(port, site.url("/slow"), n, door.pid)
        stop.set()
    return {
        "ratio": delay["ratio"],
        "delay": delay,
        "streams": held,
        "quick": quick,
        "command": "BENCH_QUICK=1 .venv/bin/python -m bench.events"
        if quick
        else ".venv/bin/python -m bench.events",
    }


if __name__ == "__main__":
    standalone(run)
