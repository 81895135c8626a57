"""Same-name stand-ins for workers that reliability tests need before they exist.

STYLE.md lets workflow tests register a same-name activity in place of a
worker. These stand-ins still run through the real :class:`WorkerRuntime`
(envelope, schemas, deadline, toolbox, error mapping) under the real spec of
the worker id they stand in for, so Temporal options (timeouts, retry
policy) stay those of the real spec.

- :class:`SlowSink`: a side effect keyed by idempotency key (a JSONL line, as
  the ``publish`` file sink writes it), then a hold, so that a test can kill
  the process after the write and before the activity completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from temporalio import activity

from activities.runtime import WorkerContext, WorkerResult, WorkerRuntime
from schemas import names
from schemas.protocol import WorkerResponse

# The worker id the stand-ins run under until the real workers are on main.
STANDIN_ID = names.VALIDATOR


def standin_activity(runtime: WorkerRuntime, worker: Any) -> Callable[..., Any]:
    """An activity named ``worker.worker_id`` that runs ``worker`` through ``runtime``."""

    async def run(request: dict[str, Any]) -> WorkerResponse:
        return await runtime.run(worker, request)

    return activity.defn(name=worker.worker_id)(run)


@contextlib.contextmanager
def registered(worker: Any, runtime: WorkerRuntime | None = None) -> Iterator[None]:
    """Serve ``worker`` in place of the registered worker with its id, for the block.

    Patches the registry line that ``build_workers`` reads, so every worker
    built inside the block (``running_stack``, ``aiworker worker``) serves the
    stand-in; ``runtime`` replaces the process's runtime (derived specs, tools).
    """
    from workers import registry

    wid = worker.worker_id
    had = wid in registry.ACTIVITY_FACTORIES
    saved = registry.ACTIVITY_FACTORIES.get(wid)
    registry.ACTIVITY_FACTORIES[wid] = lambda rt: [standin_activity(runtime or rt, worker)]
    try:
        yield
    finally:
        if had and saved is not None:
            registry.ACTIVITY_FACTORIES[wid] = saved
        else:
            registry.ACTIVITY_FACTORIES.pop(wid, None)


# --- the side effect -------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


class SlowSink:
    """Writes ``input.data`` once per idempotency key to a JSONL sink, then holds.

    The write happens before the hold, so a process killed during the hold
    has already performed the side effect: the retry must find the key and
    not write again (what the ``publish`` ledger does for its file sink).
    Every attempt is logged to ``attempts`` with its key, attempt and pid.
    """

    worker_id: ClassVar[str] = STANDIN_ID

    def __init__(self, sink: Path, attempts: Path, hold_seconds: float) -> None:
        self.sink = sink
        self.attempts = attempts
        self.hold_seconds = hold_seconds

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:
        key = ctx.request.idempotency_key
        with _locked(self.sink):
            written = any(r["idempotency_key"] == key for r in read_jsonl(self.sink))
            if not written:
                with open(self.sink, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"idempotency_key": key, "record": input["data"]}) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
        with _locked(self.attempts), open(self.attempts, "a", encoding="utf-8") as f:
            line = {"key": key, "attempt": ctx.attempt, "pid": os.getpid(), "duplicate": written}
            f.write(json.dumps(line) + "\n")
        await asyncio.sleep(self.hold_seconds)
        return WorkerResult(outputs={"valid": True, "errors": []})
