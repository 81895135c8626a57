"""From a callback POST to the next step's start, against a pipeline start's POST to
its first step's start.

One embedded Temporal server, one ``aiworker serve`` process (API key file,
loopback) and one ``aiworker worker`` process whose ``AIWORKER_SERVE_PUBLIC_URL``
is that serve, so the bench posts to the ``callback_url`` the run built. Rounds
alternate, one pipeline at a time, between:

- **callback**: ``sign`` (a wait step) hands its token to ``send`` (an aggregator
  step running meanwhile); once ``send`` has it, the bench POSTs
  ``{"outputs": ...}`` to the callback URL and takes the time it did so; the
  figure runs to the start of ``next`` (a validator step after ``sign``);
- **plain**: a pipeline of the same ``next`` step alone, from the bench's
  ``POST /v1/pipelines`` to that step's start.

Both are one HTTP request to the front door until a validator call starts; the
start is the validator's local activity's ``original_schedule_time`` in its
history marker (the worker's clock, on the same host as the bench's). ``ratio``
= callback p50 / plain p50 (the median of each round's pair is reported too).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from aiworker.schemas import names
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.devserver import stop_child
from aiworker.workers.frontdoor.auth import hash_key
from bench.common import embedded_server, percentiles, standalone, worker_env
from bench.scale_out import _polling, _Proc

COMMAND = "BENCH_QUICK=1 .venv/bin/python -m bench.callback"
KEY = "aiw_bench-callback-0123456789abcdefghij"
_SERVE = [sys.executable, "-m", "aiworker.workers.cli.main", "serve"]
_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")

NEXT = {
    "id": "next",
    "worker": "validator",
    "input": {"data": {"signed": True}, "schema": {"type": "object"}},
}
CALLBACK = {
    "name": "bench-callback",
    "steps": [
        {"id": "sign", "wait": {"schema": {"type": "object"}, "timeout_seconds": 600}},
        {
            "id": "send",
            "worker": "aggregator",
            "input": {"policy": "all", "branches": {"url": "${{ steps.sign.callback_url }}"}},
        },
        {**NEXT, "depends_on": ["sign"]},
    ],
}
PLAIN = {"name": "bench-plain", "steps": [NEXT]}


class _Serve:
    """``aiworker serve`` on a free loopback port, stopped by its PID."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [*_SERVE, "--host", "127.0.0.1", "--port", "0"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    async def url(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"aiworker serve exited: {self.log.read_text()[-2000:]}")
            m = _LISTENING.search(self.log.read_text(errors="replace"))
            if m:
                return f"http://127.0.0.1:{m.group(1)}"
            await asyncio.sleep(0.1)
        raise RuntimeError("aiworker serve did not listen in time")

    def stop(self) -> None:
        stop_child(self.proc, timeout=30)


async def _step_start(client: Client, workflow_id: str) -> float:
    """When the validator call of ``workflow_id`` was scheduled (POSIX seconds)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    for event in history.to_json_dict()["events"]:
        details = (event.get("markerRecordedEventAttributes") or {}).get("details") or {}
        if "data" not in details:
            continue
        data = json.loads(base64.b64decode(details["data"]["payloads"][0]["data"]))
        if data.get("activity_type") == names.VALIDATOR:
            at = data["original_schedule_time"]
            return float(at["seconds"]) + float(at.get("nanos", 0)) / 1e9
    raise RuntimeError(f"no validator call in {workflow_id}")


async def _start(http: httpx.AsyncClient, pipeline: dict[str, Any]) -> tuple[str, float]:
    t0 = time.time()
    r = await http.post("/v1/pipelines", json=pipeline)
    r.raise_for_status()
    return r.json()["workflow_id"], t0


async def _plain(http: httpx.AsyncClient, client: Client) -> float:
    wid, t0 = await _start(http, PLAIN)
    await client.get_workflow_handle(wid).result()
    return (await _step_start(client, wid) - t0) * 1000


async def _callback(http: httpx.AsyncClient, client: Client) -> float:
    wid, _ = await _start(http, CALLBACK)
    handle = client.get_workflow_handle(wid)
    url = None
    for _ in range(3000):
        p = await handle.query(names.PROGRESS_QUERY, True)
        send = p["steps"]["send"]
        if send["status"] == "succeeded":
            url = send["outputs"]["result"]["url"]
            break
        await asyncio.sleep(0.01)
    if url is None:
        raise RuntimeError("the token was never handed out")
    t0 = time.time()
    r = await http.post(url, json={"outputs": {"ok": True}})
    r.raise_for_status()
    await handle.result()
    return (await _step_start(client, wid) - t0) * 1000


async def run(quick: bool = False) -> dict[str, Any]:
    """Callback against plain start, alternating rounds (see the module doc)."""
    rounds = 8 if quick else 30
    out: dict[str, list[float]] = {"callback": [], "plain": []}
    with (
        tempfile.TemporaryDirectory(prefix="aiworker-callback-") as tmp,
        embedded_server() as server,
    ):
        folder = Path(tmp)
        keys = [{"name": "bench", "tenant": "bench", "sha256": hash_key(KEY)}]
        (folder / "keys.json").write_text(json.dumps({"keys": keys}))
        suffix = f"-cb{uuid.uuid4().hex[:6]}"
        env = worker_env(server.address, suffix, folder / "data")
        env.update(AIWORKER_API_KEYS_FILE=str(folder / "keys.json"))
        serve = _Serve(env, folder / "serve.log")
        worker = None
        try:
            base = await serve.url()
            worker = _Proc({**env, "AIWORKER_SERVE_PUBLIC_URL": base}, folder / "worker.log")
            client = await Client.connect(server.address, data_converter=data_converter(None))
            await _polling(client, f"{names.PIPELINES_QUEUE}{suffix}", worker.pid)
            headers = {"Authorization": f"Bearer {KEY}"}
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
                for _ in range(2):  # warm-up: first checks, first workflow tasks
                    await _plain(http, client)
                    await _callback(http, client)
                for i in range(rounds):
                    order = ("callback", "plain") if i % 2 == 0 else ("plain", "callback")
                    for path in order:
                        fn = _callback if path == "callback" else _plain
                        out[path].append(await fn(http, client))
        finally:
            if worker is not None:
                worker.stop()
            serve.stop()
    c, p = out["callback"], out["plain"]
    paired = [a / b for a, b in zip(c, p, strict=True)]
    pc, pp = percentiles(c), percentiles(p)
    return {
        "ratio": round(pc["p50"] / pp["p50"], 3),
        "ratio_paired_median": round(statistics.median(paired), 3),
        "callback_to_next_step_ms": {k: round(v, 1) for k, v in pc.items()},
        "start_to_first_step_ms": {k: round(v, 1) for k, v in pp.items()},
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "command": COMMAND if quick else ".venv/bin/python -m bench.callback",
    }


if __name__ == "__main__":
    standalone(run)
