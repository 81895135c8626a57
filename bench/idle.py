"""One-at-a-time latency: a single pipeline in flight, aiworker against bare.

Under no load a pipeline's latency is its round trips (workflow tasks,
activity tasks, the server's polls), not CPU; the throughput bench measures
the CPU. Runs rotate through the paths (each goes first in turn) so drift on a shared
machine hits all alike.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import percentiles

# how many of the last runs' workflow ids to keep (their histories are counted)
KEEP_IDS = 3


async def idle_latency(
    paths: dict[str, Callable[[], Awaitable[str]]],
    runs: int,
    warmup: int = 3,
    bases: list[str] | None = None,
) -> dict[str, Any]:
    """p50/p95 ms of each path over ``runs`` sequential runs after ``warmup`` each,
    ``ratio`` = aiworker p50 / bare p50, ``ratios``: aiworker p50 / each of
    ``bases``' p50 (default ``["bare"]``), and ``ids``: the last runs' workflow ids."""
    order = list(paths)
    for name in order:
        for _ in range(warmup):
            await paths[name]()
    samples: dict[str, list[float]] = {name: [] for name in order}
    ids: dict[str, list[str]] = {name: [] for name in order}
    for i in range(runs):
        shift = i % len(order)  # each path goes first in turn
        for name in order[shift:] + order[:shift]:
            t0 = time.perf_counter()
            wid = await paths[name]()
            samples[name].append((time.perf_counter() - t0) * 1000)
            ids[name] = [*ids[name], wid][-KEEP_IDS:]
    stats = {name: percentiles(s) for name, s in samples.items()}
    out: dict[str, Any] = {
        f"{name}_ms": {k: round(v, 1) for k, v in st.items()} for name, st in stats.items()
    }
    out["runs"] = runs
    out["ratios"] = {
        base: round(stats["aiworker"]["p50"] / stats[base]["p50"], 3)
        for base in (bases or ["bare"])
    }
    if "bare" in stats:
        out["ratio"] = round(stats["aiworker"]["p50"] / stats["bare"]["p50"], 3)
    out["ids"] = ids
    return out
