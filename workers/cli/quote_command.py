"""``aiworker check --quote FILE [--json]``: a cost quote before a run (issue #33).

The pipeline is checked first exactly as ``aiworker check`` does (exit 2 on a
bad file). The history of each step's worker comes from the evals helper's
reader, ``aiworker.workers.evals.recorded.recorded_calls`` (one history reader
in the code base); the math is :func:`aiworker.workers.quote.quote`. A build
without that reader quotes nothing and says so (every step ``unknown``).
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Mapping
from typing import Any

from aiworker.workers.cli.common import (
    EXIT_OK,
    checked_pipeline,
    command_view,
    err,
    load_pipeline_file,
)
from aiworker.workers.quote import CallSample, quote

READER_MODULE = "aiworker.workers.evals.recorded"
HISTORY_LIMIT = 200
"""Recorded calls read per step (the most recent): enough for a p95."""


def sample_of(call: Any) -> CallSample:
    """A :class:`CallSample` from a ``RecordedCall`` (usage: input plus output
    tokens, or its ``total_tokens``)."""
    usage = getattr(call, "usage", None) or {}
    if not isinstance(usage, Mapping):
        usage = getattr(usage, "model_dump", lambda: {})()
    tokens = usage.get("total_tokens")
    if tokens is None:
        tokens = int(usage.get("input_tokens", 0) or 0) + int(usage.get("output_tokens", 0) or 0)
    cost = getattr(call, "cost_usd", None)
    return CallSample(
        tokens=int(tokens or 0),
        external_calls=int(getattr(call, "external_calls", 0) or 0),
        cost_usd=None if cost is None else float(cost),
        duration_s=float(getattr(call, "duration_ms", 0) or 0) / 1000,
    )


async def step_history(
    args: argparse.Namespace, raw: Mapping[str, Any]
) -> dict[str, list[CallSample]]:
    """Step id -> recorded calls of its worker (and model alias, when the step
    names one), read with the evals reader; empty when this build has none."""
    try:
        reader = importlib.import_module(READER_MODULE)
    except ImportError:
        err(f"no history reader in this build ({READER_MODULE}): nothing recorded to quote from")
        return {}
    from aiworker.workers.cli.common import load_settings
    from aiworker.workers.client.temporal_client import connect

    client = await connect(args.profile, target_host=args.address, settings=load_settings())
    tenant = raw.get("tenant")
    out: dict[str, list[CallSample]] = {}
    for step in raw.get("steps", []):
        worker = step.get("worker")
        if not worker:
            continue
        query_kw: dict[str, Any] = {"worker": worker, "limit": HISTORY_LIMIT}
        if tenant:
            query_kw["tenant"] = tenant
        model = (step.get("input") or {}).get("model")
        if isinstance(model, str) and "${{" not in model:
            query_kw["model"] = model
        samples: list[CallSample] = []
        async for call in reader.recorded_calls(client, reader.CallQuery(**query_kw)):
            if getattr(call, "status", "succeeded") in (None, "succeeded", "ok"):
                samples.append(sample_of(call))
        out[step["id"]] = samples
    return out


async def cmd_check_quote(args: argparse.Namespace) -> int:
    """Print the quote (text, or ``--json``); exit 2 when the pipeline is invalid."""
    from aiworker.schemas.pipeline import PipelineSpec

    raw = load_pipeline_file(args.file)
    checked = checked_pipeline(raw, args.file, await command_view(args))
    spec = PipelineSpec.model_validate(checked)
    q = quote(spec, await step_history(args, checked))
    if args.json:
        print(json.dumps(q.as_dict(), indent=2))
    else:
        print(q.text())
    return EXIT_OK
