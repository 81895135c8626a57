"""Same-name stand-ins that tests register in place of a worker.

Workflow tests may register a same-name activity in place of a
worker. Two kinds live here:

- :func:`standin`: an activity that answers with whatever a test's handler
  returns (:class:`Reply`) or raises (:func:`fail`), for workflow tests that
  drive a pipeline through outcomes the real workers would need a network for;
- :class:`SlowPublish`: the real ``publish`` worker, run through the real
  :class:`WorkerRuntime` under its real spec, followed by a hold, so that a
  test can kill the process (or the server) after the side effect and before
  the activity completes. :func:`registered` serves it in place of the
  built-in, in process; :func:`slow_publish_worker` runs ``aiworker worker``
  with it as its own process (``python -m support.standins``, :func:`main`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from aiworker.activities.publish import Publish
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.schemas import names
from support.procs import WorkerProcess

# --- scripted stand-ins for workflow tests ---------------------------------------------------


@dataclass
class Reply:
    """What a stand-in returns: outputs plus optional status and usage."""

    outputs: dict[str, Any]
    status: str = "succeeded"
    usage: dict[str, int] = field(default_factory=dict)


def fail(
    code: str,
    message: str = "stand-in failure",
    retryable: bool = False,
    reasons: list[dict[str, Any]] | None = None,
) -> ApplicationError:
    """A failure shaped like the runtime's (code as type, ErrorInfo in details)."""
    return ApplicationError(
        message,
        {
            "code": code,
            "message": message,
            "retryable": retryable,
            "reasons": reasons or [],
            "context": {"attempt": 1},
        },
        type=code,
        non_retryable=not retryable,
    )


Handler = Callable[[dict[str, Any]], Awaitable[Reply | dict[str, Any]]]


def standin(name: str, handler: Handler, calls: list[dict[str, Any]] | None = None) -> Any:
    """An activity named ``name`` that answers every request with ``handler``.

    Every request is appended to ``calls`` when given; a plain dict from the
    handler is the outputs of a succeeded reply.
    """

    @activity.defn(name=name)
    async def act(request: dict[str, Any]) -> dict[str, Any]:
        if calls is not None:
            calls.append(request)
        reply = await handler(request)
        if isinstance(reply, dict):
            reply = Reply(reply)
        return {
            "worker_id": name,
            "version": "1",
            "status": reply.status,
            "outputs": reply.outputs,
            "usage": reply.usage,
            "observability": {"worker_id": name, "attempt": activity.info().attempt},
        }

    return act


def never_ends(name: str, details: Callable[[int], dict[str, Any] | None]) -> Any:
    """An activity named ``name`` whose attempts never end: each heartbeats
    ``details(attempt)`` (None: no heartbeat) and then waits until cancelled, so
    the server's start-to-close timeout ends it, as when its process is lost."""

    @activity.defn(name=name)
    async def act(request: dict[str, Any]) -> dict[str, Any]:
        doc = details(activity.info().attempt)
        if doc is not None:
            activity.heartbeat(doc)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return act


# --- a real worker with a hold, in process or as its own process ---------------------------


@contextlib.contextmanager
def registered(worker: Worker) -> Iterator[None]:
    """Serve ``worker`` in place of the built-in worker with its id, for the block.

    Swaps the built-in in the list every process loads its workers from, so
    a worker process started inside the block (``aiworker worker``) serves
    the stand-in and nothing else changes.
    """
    from aiworker.workers.process import worker_set as plugins

    shipped = plugins.builtin_entries

    def with_standin() -> list[Any]:
        return [worker if w.worker_id == worker.worker_id else w for w in shipped()]

    plugins.builtin_entries = with_standin  # type: ignore[assignment]
    try:
        yield
    finally:
        plugins.builtin_entries = shipped  # type: ignore[assignment]


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
    """The records of a JSONL file; none while it does not exist."""
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

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
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
    """A ``publish`` step to a JSONL file sink under ``<data dir>/sinks/<tenant>``."""
    return {
        "id": step_id,
        "worker": names.PUBLISH,
        "input": {"sink": {"file": sink_file}, "record": record_ref},
        **extra,
    }


def slow_publish_worker(
    attempts: Path, hold_seconds: float, env: dict[str, str], log: Path
) -> WorkerProcess:
    """A worker process (:func:`main`) that serves :class:`SlowPublish`.

    ``env`` is the worker's environment (``procs.worker_env``); the ``tests``
    folder goes on its ``PYTHONPATH`` so that ``-m support.standins`` resolves.
    """
    tests = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (tests, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "support.standins"]
    cmd += ["--attempts", str(attempts), "--hold", str(hold_seconds)]
    return WorkerProcess(cmd, {**env, "PYTHONPATH": path}, log)


def main() -> None:
    """``aiworker worker`` with a hold after each ``publish``.

    It swaps one entry of the worker list and then runs the very code path
    of the ``aiworker worker`` command (``workers.cli.main.run_main`` with
    ``worker``: settings from the environment, search attributes,
    ``build_workers``, ``run_until_stopped``), so the process under test is
    the real worker process apart from that one activity.
    """
    from aiworker.workers.cli.main import run_main

    p = argparse.ArgumentParser()
    p.add_argument("--attempts", required=True, type=Path)
    p.add_argument("--hold", required=True, type=float)
    args = p.parse_args()
    worker = SlowPublish(args.attempts, args.hold)
    # The console script's own entry, so the process exits as `aiworker worker` does.
    sys.argv = [sys.argv[0], "worker"]
    with registered(worker):
        run_main()


if __name__ == "__main__":
    main()
