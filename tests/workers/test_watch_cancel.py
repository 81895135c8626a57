"""``aiworker run``'s progress polls stop when cancelled (Ctrl-C), also when the
cancel reaches a query mid-call and comes back as an ``RPCError`` ("operation was
canceled"), which the polls otherwise take for a failed query and poll again.

The query here is a stand-in that answers a cancel the way the SDK's bridge can
(the real race needs a server slow at the right moment); the loops are the real
ones.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from aiworker.workers.client import waits, watch


async def _cancel_as_rpc_error(calls: list[str], asked: asyncio.Event) -> Any:
    calls.append("query")
    asked.set()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        raise RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"") from None


class _View:
    frame_seconds = 0.01

    def update(self, snap: Any, elapsed: float) -> None:
        raise AssertionError("no snapshot came back")

    def tick(self, elapsed: float) -> None:
        pass

    def close(self, doc: Any, elapsed: float) -> None:
        pass


class _Pipelines:
    temporal = None


async def _stops(task: asyncio.Task[Any], calls: list[str], asked: asyncio.Event) -> None:
    await asyncio.wait_for(asked.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert calls == ["query"]  # no poll after the cancel


def _live_view(wid: str) -> Any:
    return watch._watch(_Pipelines(), wid, _View(), time.monotonic())  # type: ignore[arg-type]


def _wait_notices(wid: str) -> Any:
    return waits.report_waits(None, wid, lambda line: None, poll=0.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("module", "loop"),
    [(watch, _live_view), (waits, _wait_notices)],
    ids=["the live view", "the wait notices"],
)
async def test_the_poll_stops_on_a_cancel_turned_rpc_error(
    monkeypatch: pytest.MonkeyPatch, module: Any, loop: Any
) -> None:
    calls: list[str] = []
    asked = asyncio.Event()
    monkeypatch.setattr(module, "snapshot", lambda t, wid: _cancel_as_rpc_error(calls, asked))
    task = asyncio.create_task(loop("wf"))
    await _stops(task, calls, asked)
