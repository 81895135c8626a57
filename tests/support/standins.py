"""Same-name stand-ins that reliability tests register in place of a worker.

STYLE.md lets workflow tests register a same-name activity in place of a
worker. These stand-ins run through the real :class:`WorkerRuntime`
(envelope, schemas, deadline, toolbox, error mapping) under the real spec of
the worker they stand in for, so Temporal options (timeouts, retry policy)
stay those of the real spec.

- :class:`SlowPublish`: the real ``publish`` worker followed by a hold, so
  that a test can kill the process (or the server) after the side effect and
  before the activity completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from temporalio import activity

from aiworker.activities.publish import Publish
from aiworker.activities.runtime import WorkerContext, WorkerResult, WorkerRuntime
from aiworker.activities.sdk import Worker
from aiworker.schemas import names
from aiworker.schemas.protocol import WorkerResponse


def standin_activity(runtime: WorkerRuntime, worker: Any) -> Callable[..., Any]:
    """An activity named ``worker.worker_id`` that runs ``worker`` through ``runtime``."""

    async def run(request: dict[str, Any]) -> WorkerResponse:
        return await runtime.run(worker, request)

    return activity.defn(name=worker.worker_id)(run)


@contextlib.contextmanager
def registered(worker: Worker) -> Iterator[None]:
    """Serve ``worker`` in place of the built-in worker with its id, for the block.

    Swaps the built-in in the list every process loads its workers from, so
    a worker process started inside the block (``aiworker worker``) serves
    the stand-in and nothing else changes.
    """
    from aiworker.workers import plugins

    shipped = plugins.builtin_workers

    def with_standin() -> list[Worker]:
        return [worker if w.worker_id == worker.worker_id else w for w in shipped()]

    plugins.builtin_workers = with_standin  # type: ignore[assignment]
    try:
        yield
    finally:
        plugins.builtin_workers = shipped  # type: ignore[assignment]


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


class SlowPublish(Publish):
    """The real ``publish`` worker, then a hold before the activity completes.

    The write happens before the hold, so a process killed during the hold
    has already performed the side effect: the retry must find the key in the
    publish ledger and not write again. Every attempt is logged to
    ``attempts`` with its key, attempt, pid and whether publish saw a duplicate.
    """

    def __init__(self, attempts: Path, hold_seconds: float) -> None:
        self.attempts = attempts
        self.hold_seconds = hold_seconds

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:
        result = await super().execute(ctx, input)
        line = {
            "key": ctx.request.idempotency_key,
            "attempt": ctx.attempt,
            "pid": os.getpid(),
            "duplicate": result.outputs["duplicate"],
        }
        with _locked(self.attempts), open(self.attempts, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        await asyncio.sleep(self.hold_seconds)
        return result


def publish_step(step_id: str, record_ref: str, sink_file: str, **extra: Any) -> dict[str, Any]:
    """A ``publish`` step to a JSONL file sink under ``<data dir>/sinks``."""
    return {
        "id": step_id,
        "worker": names.PUBLISH,
        "input": {"sink": {"file": sink_file}, "record": record_ref},
        **extra,
    }
