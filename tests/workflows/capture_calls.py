"""Capture what a build's callers send to the auto-upgrade workflows, for
``test_cross_build.py``.

An auto-upgrade workflow (limiter, breaker, registry, flow) moves to the newest
build at its next workflow task, while the pinned runs of the previous build
(pipelines, chunks, agents), its worker processes and its clients keep sending
it what that build sends: signal-with-start inputs, signals, updates. This
reads those from histories recorded on that build (``record_histories.py
--out DIR limiter breaker registry flow`` run on its code) and writes them as
one JSON file: per history, the workflow type and its calls in order, each
with its arguments as JSON and, for an update, the answer that build gave, and
the signals the workflow sent its callers (``sent``)::

    .venv/bin/python tests/workflows/capture_calls.py /tmp/main-histories \\
        --build "0.1.0 (main 080adb8)" --out tests/workflows/cross_build/0.1.0.json

Payloads only grow: a later build answers every call captured here.
"""

from __future__ import annotations

import argparse
import base64
import json
from datetime import datetime
from pathlib import Path
from typing import Any

# The workflow types that auto-upgrade, by the histories that record them.
AUTO_UPGRADE = {
    "LimiterWorkflow",
    "SharedBreakerWorkflow",
    "WorkerRegistryWorkflow",
    "PipelineFlowWorkflow",
}


def _value(payload: dict[str, Any]) -> Any:
    encoding = base64.b64decode(payload.get("metadata", {}).get("encoding", "")).decode()
    if encoding == "binary/null":
        return None
    if encoding != "json/plain":
        raise ValueError(f"payload encoded {encoding!r}: capture from a recording without codecs")
    return json.loads(base64.b64decode(payload.get("data", "")))


def _args(payloads: dict[str, Any] | None) -> list[Any]:
    return [_value(p) for p in (payloads or {}).get("payloads", [])]


def recorded_at(history: dict[str, Any]) -> float:
    """The epoch time of the history's first event."""
    when = history["events"][0]["eventTime"]
    # the server writes nanoseconds; fromisoformat takes at most microseconds
    head, _, frac = when.rstrip("Z").partition(".")
    stamp = datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00")
    return stamp.timestamp()


def calls_of(history: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The workflow type and the calls it received, in history order."""
    events = history["events"]
    started = events[0]["workflowExecutionStartedEventAttributes"]
    calls: list[dict[str, Any]] = [{"kind": "start", "args": _args(started.get("input"))}]
    answers: dict[str, Any] = {}
    for e in events:
        done = e.get("workflowExecutionUpdateCompletedEventAttributes")
        if done is not None and "success" in done.get("outcome", {}):
            answers[done["meta"]["updateId"]] = _args(done["outcome"]["success"])
    for e in events:
        if (sent := e.get("signalExternalWorkflowExecutionInitiatedEventAttributes")) is not None:
            # what it sends the callers (a limiter's permit, lease-check): they decode it
            calls.append(
                {"kind": "sent", "name": sent["signalName"], "args": _args(sent.get("input"))}
            )
        elif (signal := e.get("workflowExecutionSignaledEventAttributes")) is not None:
            calls.append(
                {"kind": "signal", "name": signal["signalName"], "args": _args(signal.get("input"))}
            )
        elif (accepted := e.get("workflowExecutionUpdateAcceptedEventAttributes")) is not None:
            request = accepted["acceptedRequest"]
            answer = answers.get(request["meta"]["updateId"])
            calls.append(
                {
                    "kind": "update",
                    "name": request["input"]["name"],
                    "args": _args(request["input"].get("args")),
                    "answer": answer[0] if answer else None,
                }
            )
    return started["workflowType"]["name"], calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="histories recorded on the previous build")
    parser.add_argument("--build", required=True, help="which build recorded them")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    captured = []
    for path in sorted(args.folder.glob("*.json")):
        history = json.loads(path.read_text("utf-8"))
        kind, calls = calls_of(history)
        if kind in AUTO_UPGRADE:
            captured.append(
                {
                    "history": path.stem,
                    "workflow": kind,
                    "recorded_at": recorded_at(history),
                    "calls": calls,
                }
            )
    out = {"build": args.build, "histories": captured}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", "utf-8")
    print(f"wrote {args.out}: {len(captured)} histories")


if __name__ == "__main__":
    main()
