"""An external aiworker worker: a standalone process that imports nothing from aiworker.

It serves the worker its spec file describes (``specs/text-stats.json``:
word and sentence counts, top words, reading time) to pipelines run by
aiworker, using only ``temporalio``, ``jsonschema``, its spec and the JSON
Schemas aiworker exports (``schemas/json/``). Copy it to write a worker in
any language with a Temporal SDK (TypeScript, Go, Java, .NET); the contract:

1. **Poll** the spec's ``task_queue`` (plus the deployment's suffix,
   ``AIWORKER_TASK_QUEUE_SUFFIX``) in the pipelines' namespace, and register
   **one activity named** the spec's ``worker_id``. Payloads are plain JSON
   (``json/plain``), the default of every Temporal SDK.
2. The activity gets one argument, the **request** (``worker-request.schema.json``):
   ``worker_id, version, idempotency_key, step_id, tenant, trace, input,
   constraints``. Check it and its ``input`` against the spec's
   ``input_schema``; ``constraints.timeout_seconds`` may only tighten the
   spec's ``constraints.timeout_seconds`` (a looser one is ``invalid_input``).
   Stop at the tighter deadline (``timeout``).
3. On success return the **response** (``worker-response.schema.json``):
   ``{worker_id, version, status: "succeeded"|"partial", outputs, warnings,
   artifacts, usage, observability: {worker_id, attempt, duration_ms,
   timeout_seconds, trace_id, span_id}}``, ``outputs`` valid against the
   spec's ``output_schema``. aiworker checks both; a malformed envelope or
   output fails the step as ``invalid_output`` and goes no further.
4. On failure raise an **ApplicationError** whose ``type`` is a stable error
   code (``invalid_input``, ``timeout``, ``upstream_error``, ...), whose
   ``non_retryable`` is true for the codes that are not retryable
   (``invalid_input``, ``invalid_output``, ``access_denied``, ``not_found``,
   ``egress_denied``, ``payload_too_large``, ``tool_not_allowed``,
   ``budget_exceeded``, ``validation_failed``), and
   whose one detail is an **ErrorInfo** (``error-info.schema.json``:
   ``{code, message, retryable, worker_id, field, reasons, context: {attempt}}``).
   Temporal's retry policy, derived by aiworker from the spec's ``retries``,
   does the retrying. Any other failure (an uncaught exception, whose type
   is your SDK's or language's) fails the step as ``internal`` naming that
   type, and details that are no ErrorInfo are dropped.

The envelopes grow by optional fields only: ignore request fields you do not
know rather than reject them.

Run it beside a Temporal server that aiworker uses::

    python examples/external/worker.py --address localhost:7233
    AIWORKER_WORKER_SPECS=examples/external/specs aiworker worker   # knows, does not serve it

The ``--malformed-envelope``, ``--bad-outputs``, ``--fail-attempts`` and
``--delay`` switches make it misbehave on purpose (tests, conformance).
SIGTERM or SIGINT stops it after in-flight calls finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

HERE = Path(__file__).resolve().parent
RETRYABLE = {"timeout", "upstream_error", "rate_limited", "internal"}  # of the codes used here


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text("utf-8"))


def reasons_of(
    validator: Draft202012Validator, doc: Any, *, open_ended: bool = False
) -> list[dict[str, str]]:
    """Schema errors as ``[{path, message}]``, the shape aiworker's reasons have.

    ``open_ended``: fields the schema does not list are no error. The request
    envelope grows by optional fields; a worker ignores the ones it does not know.
    """
    errors = [
        e
        for e in validator.iter_errors(doc)
        if not (open_ended and e.validator == "additionalProperties")
    ]
    errors.sort(key=lambda e: list(map(str, e.absolute_path)))
    return [
        {
            "path": "$"
            + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path),
            "message": e.message,
        }
        for e in errors[:20]
    ]


def text_stats(text: str, top: int = 5, words_per_minute: int = 230) -> dict[str, Any]:
    """The worker's own work: deterministic, no network."""
    words = re.findall(r"[^\W_]+(?:'[^\W_]+)*", text.lower())
    sentences = [s for s in re.split(r"[.!?]+", text) if re.search(r"\w", s)]
    counts = sorted(Counter(words).items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return {
        "words": len(words),
        "sentences": len(sentences),
        "characters": len(text),
        "top_words": [{"word": w, "count": n} for w, n in counts],
        "reading_seconds": round(len(words) * 60 / words_per_minute, 1),
    }


def make_activity(spec: dict[str, Any], schemas: Path, args: argparse.Namespace) -> Any:
    """The one activity, named by the spec's ``worker_id``."""
    worker_id = spec["worker_id"]
    request_v = Draft202012Validator(load(schemas / "worker-request.schema.json"))
    response_v = Draft202012Validator(load(schemas / "worker-response.schema.json"))
    error_v = Draft202012Validator(load(schemas / "error-info.schema.json"))
    input_v = Draft202012Validator(spec["input_schema"])
    output_v = Draft202012Validator(spec["output_schema"])
    spec_timeout = float(spec["constraints"]["timeout_seconds"])

    def fail(code: str, message: str, attempt: int, **extra: Any) -> ApplicationError:
        info = {
            "code": code,
            "message": message,
            "retryable": code in RETRYABLE,
            "worker_id": worker_id,
            "context": {"attempt": attempt},
            **extra,
        }
        if not error_v.is_valid(info):  # a bug here: still fail with a stable code
            code, info = "internal", {"code": "internal", "message": message, "retryable": True}
        return ApplicationError(message, info, type=code, non_retryable=code not in RETRYABLE)

    @activity.defn(name=worker_id)
    async def run(request: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        attempt = activity.info().attempt
        if reasons := reasons_of(request_v, request, open_ended=True):
            raise fail(
                "invalid_input", "the request envelope is malformed", attempt, reasons=reasons
            )
        major = str(request.get("version", "")).split(".")[0]
        if major != str(spec["version"]).split(".")[0]:
            raise fail(
                "invalid_input",
                f"request speaks contract version {request.get('version')!r}; "
                f"{worker_id} implements {spec['version']!r}",
                attempt,
                field="version",
            )
        if reasons := reasons_of(input_v, request["input"]):
            first = reasons[0]
            raise fail(
                "invalid_input",
                f"input{first['path'][1:]}: {first['message']}",
                attempt,
                reasons=reasons,
                field="input" + first["path"][1:],
            )
        asked = (request.get("constraints") or {}).get("timeout_seconds")
        if asked is not None and asked > spec_timeout:
            raise fail(
                "invalid_input",
                f"constraints.timeout_seconds={asked} loosens the spec's {spec_timeout:g}",
                attempt,
                field="constraints.timeout_seconds",
            )
        timeout = spec_timeout if asked is None else asked
        if attempt <= args.fail_attempts:
            raise fail("upstream_error", f"failing attempt {attempt} on purpose", attempt)

        async def work() -> dict[str, Any]:
            await asyncio.sleep(args.delay)
            return text_stats(**request["input"])

        try:
            outputs = await asyncio.wait_for(work(), timeout)
        except TimeoutError:
            raise fail("timeout", f"no result within {timeout:g}s", attempt) from None
        if args.bad_outputs:
            outputs = {"words": "many"}
        elif reasons := reasons_of(output_v, outputs):
            raise fail(
                "invalid_output", "the outputs fail the output schema", attempt, reasons=reasons
            )
        trace = request.get("trace") or {}
        response = {
            "worker_id": worker_id,
            "version": spec["version"],
            "status": "succeeded",
            "outputs": outputs,
            "warnings": [],
            "artifacts": [],
            "usage": {"input_tokens": 0, "output_tokens": 0, "external_calls": 0},
            "observability": {
                "worker_id": worker_id,
                "attempt": attempt,
                "duration_ms": round((time.monotonic() - started) * 1000, 3),
                "timeout_seconds": timeout,
                "trace_id": trace.get("trace_id"),
                "span_id": trace.get("span_id"),
            },
        }
        if args.malformed_envelope:
            return {"worker_id": worker_id, "outputs": outputs}  # no status, no observability
        if reasons := reasons_of(response_v, response):  # a bug here, not in the caller
            raise fail("internal", "the response envelope is malformed", attempt, reasons=reasons)
        return response

    return run


async def main(args: argparse.Namespace) -> None:
    spec = load(Path(args.spec))
    client = await Client.connect(args.address, namespace=args.namespace)
    queue = spec["task_queue"] + args.task_queue_suffix
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(
        client,
        task_queue=queue,
        activities=[make_activity(spec, Path(args.schemas), args)],
        graceful_shutdown_timeout=timedelta(seconds=5),
    )
    async with worker:  # leaving the block drains in-flight calls, then stops polling
        print(f"{spec['worker_id']}: polling {queue} on {args.address}", flush=True)
        await stop.wait()
    print(f"{spec['worker_id']}: stopped", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=env("TEMPORAL_ADDRESS", "localhost:7233"))
    p.add_argument("--namespace", default=env("TEMPORAL_NAMESPACE", "default"))
    p.add_argument(
        "--task-queue-suffix",
        default=env("AIWORKER_TASK_QUEUE_SUFFIX", ""),
        help="appended to the spec's task_queue, as AIWORKER_TASK_QUEUE_SUFFIX",
    )
    p.add_argument("--spec", default=str(HERE / "specs" / "text-stats.json"))
    p.add_argument(
        "--schemas",
        default=str(HERE.parent.parent / "schemas" / "json"),
        help="the directory of aiworker's exported JSON Schemas",
    )
    bad = p.add_argument_group("misbehaviour on purpose (tests)")
    bad.add_argument(
        "--malformed-envelope", action="store_true", help="answer without status and observability"
    )
    bad.add_argument(
        "--bad-outputs", action="store_true", help="answer outputs that violate the output schema"
    )
    bad.add_argument(
        "--fail-attempts",
        type=int,
        default=0,
        help="fail the first N attempts with upstream_error (retryable)",
    )
    bad.add_argument("--delay", type=float, default=0.0, help="seconds of work per call")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
    # Skip interpreter finalization: Temporal Core's Rust threads may still call
    # into Python then and abort the process (temporalio/sdk-python#300).
    sys.stdout.flush()
    os._exit(0)
