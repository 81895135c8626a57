"""The bench's printed tables and its targets (issue 17), from the figures of one run."""

from __future__ import annotations

import math
from typing import Any

from bench.common import table

THROUGHPUT_MIN_RATIO = 0.9
IDLE_MAX_RATIO = 1.1
HISTORY_MAX_BYTES = 2_000_000
RSS_MAX_FACTOR = 1.5


def _check(target: str, value: Any, limit: float, ok: bool | None) -> dict[str, Any]:
    return {"target": target, "value": value, "limit": limit, "met": ok}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not math.isnan(v)


def targets(out: dict[str, Any]) -> dict[str, Any]:
    """Each target with its figure from ``out`` and ``met``: true, false, or null when
    the figure is missing (a benchmark skipped or failed); ``all_met`` is true only
    when every target is met."""
    checks = []
    for c in out.get("throughput", []):
        r = c["ratio"]
        checks.append(
            _check(
                f"throughput {c['case']}: ratio >= 0.9",
                round(r, 3),
                THROUGHPUT_MIN_RATIO,
                r >= THROUGHPUT_MIN_RATIO,
            )
        )
    for case, r in out.get("idle_latency_ratio_vs_bare", {}).items():
        checks.append(
            _check(f"idle p50 {case}: ratio <= 1.1", r, IDLE_MAX_RATIO, r <= IDLE_MAX_RATIO)
        )
    fe_out = out.get("for_each")
    fe: dict[str, Any] = fe_out if isinstance(fe_out, dict) else {}
    items = fe.get("items")
    largest: Any = fe.get("largest_history_bytes")
    checks.append(
        _check(
            f"for_each ({items} items): largest history <= 2 MB (bytes)",
            largest,
            HISTORY_MAX_BYTES,
            largest <= HISTORY_MAX_BYTES if _number(largest) else None,
        )
    )
    peak, idle = fe.get("peak_worker_rss_mb"), fe.get("rss_before_mb")
    factor = round(peak / idle, 3) if _number(peak) and _number(idle) and idle else None
    checks.append(
        _check(
            f"for_each ({items} items): peak worker RSS <= 1.5x idle RSS (factor)",
            factor,
            RSS_MAX_FACTOR,
            factor <= RSS_MAX_FACTOR if factor is not None else None,
        )
    )
    return {"checks": checks, "all_met": all(c["met"] is True for c in checks)}


def print_report(out: dict[str, Any]) -> None:
    """The throughput, idle-latency, per-pipeline and targets tables."""
    rows = []
    for c in out["throughput"]:
        rows.append(
            {
                "case": c["case"],
                "bare/s": c["bare_per_s"],
                "aiworker/s": c["aiworker_per_s"],
                "ratio": c["ratio"],
                "bare p50/p95/p99 ms": _pcts(c["bare_latency_ms"]),
                "aiworker p50/p95/p99 ms": _pcts(c["aiworker_latency_ms"]),
            }
        )
    print("throughput (20 in flight)\n" + table(rows, list(rows[0])))
    rows = [
        {
            "case": case,
            "bare p50 ms": i["bare_ms"]["p50"],
            "aiworker p50 ms": i["aiworker_ms"]["p50"],
            "ratio": i["ratio"],
            "bare p95 ms": i["bare_ms"]["p95"],
            "aiworker p95 ms": i["aiworker_ms"]["p95"],
            "runs": i["runs"],
        }
        for case, i in out["idle_latency"].items()
    ]
    print("\nidle latency (one pipeline at a time)\n" + table(rows, list(rows[0])))
    rows = []
    for case, p in out["per_pipeline"].items():
        b, o, r = p["bare"], p["aiworker"], p["aiworker_vs_bare"]
        rows.append(
            {
                "case": case,
                "wf tasks": _pair(o, b, "workflow_tasks"),
                "events": _pair(o, b, "events"),
                "activities": _pair(o, b, "activities"),
                "local acts": _pair(o, b, "local_activities"),
                "payload B": f"{_pair(o, b, 'payload_bytes')} ({r.get('payload_bytes')}x)",
                "history B": f"{_pair(o, b, 'history_bytes')} ({r.get('history_bytes')}x)",
                "worker cpu ms": f"{_pair(o, b, 'worker_cpu_s', _ms)} ({r.get('worker_cpu_s')}x)",
                "server cpu ms": f"{_pair(o, b, 'server_cpu_s', _ms)} ({r.get('server_cpu_s')}x)",
            }
        )
    print("\nper pipeline, aiworker/bare\n" + table(rows, list(rows[0])))
    rows = [
        {
            "target": c["target"],
            "value": c["value"],
            "limit": c["limit"],
            "met": {True: "yes", False: "NO", None: "n/a"}[c["met"]],
        }
        for c in out["targets"]["checks"]
    ]
    print(
        f"\ntargets ({'quick run' if out['quick'] else 'full run'}): "
        f"{'all met' if out['targets']['all_met'] else 'NOT all met'}\n"
        + table(rows, list(rows[0]))
    )


def _pair(o: dict[str, Any], b: dict[str, Any], key: str, fmt: Any = str) -> str:
    return f"{fmt(o[key])}/{fmt(b[key])}"


def _pcts(ms: dict[str, float]) -> str:
    return "/".join(f"{ms[k]:.0f}" for k in ("p50", "p95", "p99"))


def _ms(seconds: float) -> str:
    return "nan" if math.isnan(seconds) else f"{seconds * 1000:.1f}"
