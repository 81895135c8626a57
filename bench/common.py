"""Shared benchmark helpers: percentiles, a private embedded server, tables."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiworker.workers.devserver import DevServer, free_port


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


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain text table."""
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines.append("  ".join("-" * widths[c] for c in columns))
    for r in rows:
        lines.append("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return "" if v is None else str(v)
