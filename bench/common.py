"""Shared benchmark helpers: percentiles, a private embedded server, tables."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from aiworker.activities.errors import NotFoundError
from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools import scrape_tools
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas.protocol import ArtifactRef
from aiworker.workers.devstack.devserver import DevServer, free_port


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50/p95/p99 (same unit as the samples)."""
    if not samples:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan")}
    s = sorted(samples)

    def q(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"p50": q(0.50), "p95": q(0.95), "p99": q(0.99), "mean": statistics.fmean(s)}


@contextmanager
def embedded_server(fast_poll: bool = False) -> Iterator[DevServer]:
    """The embedded dev server exactly as `aiworker dev` runs it, in a temp dir."""
    with tempfile.TemporaryDirectory(prefix="aiworker-bench-") as d:
        server = DevServer(Path(d), port=free_port(), ui_port=None, fast_poll=fast_poll)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@asynccontextmanager
async def scrape_runtime(prefix: str) -> AsyncIterator[WorkerRuntime]:
    """A worker runtime with the real scrape tools over a temporary data directory
    (loopback allowed), its per-call log lines silenced."""
    logging.getLogger("aiworker.worker").addHandler(logging.NullHandler())
    logging.getLogger("aiworker.worker").propagate = False
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        settings = Settings(data_dir=Path(tmp), metrics_port=0, allow_private_networks=True)
        tools = scrape_tools(settings)
        try:
            yield WorkerRuntime(
                settings, load_specs(), tools=tools, metrics=WorkerMetrics(CollectorRegistry())
            )
        finally:
            await tools["fetch_url"].aclose()


class UnwrittenPages:
    """An artifact store that hashes and refers but writes nothing: the scrape benches'
    third path, which shows what storing the raw page (one file per page) costs."""

    async def put(
        self, tenant: str, data: bytes, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        uri = f"file:///unwritten/{digest}"
        return ArtifactRef(uri=uri, sha256=digest, size_bytes=len(data), media_type=media_type)

    async def get(self, tenant: str, ref: ArtifactRef | str) -> bytes:
        raise NotFoundError("the bench's unwritten store keeps nothing")


def without_page_writes(runtime: WorkerRuntime) -> WorkerRuntime:
    """``runtime`` with the same tools and settings but :class:`UnwrittenPages`."""
    tools = {**runtime.tools, "artifact_store": UnwrittenPages()}
    return WorkerRuntime(runtime.settings, runtime.specs, tools=tools, metrics=runtime.metrics)


async def interleaved(
    rounds: int,
    paths: dict[str, Callable[[], Awaitable[None]]],
    between: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Seconds each path spent over ``rounds`` rounds, run in alternating order round
    by round, so load from other processes on a shared machine hits them alike;
    ``between`` runs before each round (a new page for all paths)."""
    spent = dict.fromkeys(paths, 0.0)
    order = list(paths.items())
    for i in range(rounds):
        between()
        for name, fn in order if i % 2 else order[::-1]:
            t0 = time.perf_counter()
            await fn()
            spent[name] += time.perf_counter() - t0
    return spent


def process_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system, all threads) of this process or of ``pid``.

    Another process's figure comes from ``/proc/<pid>/stat`` (Linux); NaN where
    that cannot be read.
    """
    if pid is None:
        return time.process_time()
    try:
        with open(f"/proc/{pid}/stat") as f:
            # fields after the command name (which may hold spaces), utime and stime
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain text table."""
    widths = {c: max([len(c), *(len(_fmt(r.get(c))) for r in rows)]) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines.append("  ".join("-" * widths[c] for c in columns))
    for r in rows:
        lines.append("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return "" if v is None else str(v)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def standalone(run: Callable[[bool], Coroutine[Any, Any, dict[str, Any]]]) -> None:
    """``python -m bench.<part>``: run one part (``BENCH_QUICK=1`` for the reduced
    size, or ``--quick``) and print its JSON. SIGTERM (a ``timeout``, Ctrl-C in a pipeline) unwinds
    like Ctrl-C, so the worker processes, the model server and the Temporal server
    the part started are stopped by PID."""
    signal.signal(signal.SIGTERM, _terminate)
    quick = "--quick" in sys.argv or os.environ.get("BENCH_QUICK", "") not in ("", "0")
    print(json.dumps(asyncio.run(run(quick)), indent=2, default=str))


def worker_env(address: str, suffix: str, data: Path, **extra: str) -> dict[str, str]:
    """The environment of an ``aiworker worker`` process a bench starts: this
    process's environment without any ``AIWORKER_``/``TEMPORAL_`` setting of its
    own, pointed at the bench's server, queues and data directory; ``extra`` adds
    settings (e.g. ``AIWORKER_RATE_LIMITS``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env.update(
        TEMPORAL_ADDRESS=address,
        TEMPORAL_NAMESPACE="default",
        AIWORKER_TASK_QUEUE_SUFFIX=suffix,
        AIWORKER_METRICS_PORT="0",
        AIWORKER_DATA_DIR=str(data),
        AIWORKER_SHUTDOWN_GRACE_SECONDS="5",
        AIWORKER_LOG_LEVEL="WARNING",
    )
    env.update(extra)
    return env
