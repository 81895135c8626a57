"""The bench's printed tables and its targets (issues 17 and 29), from the figures on record."""

from __future__ import annotations

import math
from typing import Any

from bench.common import table

THROUGHPUT_MIN_RATIO = 0.9
IDLE_MAX_RATIO = 1.1
HISTORY_MAX_BYTES = 2_000_000
RSS_MAX_FACTOR = 1.5
# issue 29: against what users would pick instead
LIMITER_MIN_PERMITS_PER_S = 200.0
LIMITER_MAX_P95_MS = 100.0
CRAWL_MIN_RATIO = 0.8
PAGE_MIN_RATIO = 0.9
LLM_STREAM_MIN_RATIO = 0.95
LLM_FIRST_TOKEN_MAX_MS = 50.0
# issue 48: every step a regular activity against bare regular activities, and
# local activities against bare local activities
REGULAR_MIN_RATIO = 0.9
REGULAR_MAX_CPU_RATIO = 1.3
LOCAL_MIN_RATIO = 1.0
# issue 31: a hostile page leaves the worker within 10% of its memory; a slow-client
# burst leaves the front door holding the descriptors it held before
HOSTILE_MAX_RSS_RATIO = 1.1
HEALTHZ_MAX_MS = 100.0


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
    checks.extend(_issue48(out))
    checks.extend(_issue29(out))
    checks.extend(_issue31(out))
    return {"checks": checks, "all_met": all(c["met"] is True for c in checks)}


def _part(out: dict[str, Any], key: str) -> dict[str, Any]:
    part = out.get(key)
    return part if isinstance(part, dict) else {}


def _at_least(target: str, value: Any, limit: float) -> dict[str, Any]:
    return _check(target, value, limit, value >= limit if _number(value) else None)


def _below(target: str, value: Any, limit: float) -> dict[str, Any]:
    return _check(target, value, limit, value < limit if _number(value) else None)


def _issue48(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Like against like: regular-activity pipelines against bare regular
    activities (throughput, idle p50, worker CPU), local against bare local."""
    checks = []
    for case, r in _part(out, "throughput_ratio_regular").items():
        checks.append(_at_least(f"regular {case}: throughput ratio >= 0.9", r, REGULAR_MIN_RATIO))
    for case, r in _part(out, "idle_latency_ratio_regular").items():
        checks.append(
            _check(f"regular {case}: idle p50 ratio <= 1.1", r, IDLE_MAX_RATIO, r <= IDLE_MAX_RATIO)
        )
    for case, r in _part(out, "worker_cpu_ratio_regular").items():
        checks.append(
            _check(
                f"regular {case}: worker CPU per pipeline ratio <= 1.3",
                r,
                REGULAR_MAX_CPU_RATIO,
                r <= REGULAR_MAX_CPU_RATIO,
            )
        )
    for case, r in _part(out, "throughput_ratio_local").items():
        checks.append(
            _at_least(f"local {case}: throughput ratio to bare local >= 1.0", r, LOCAL_MIN_RATIO)
        )
    return checks


def _issue29(out: dict[str, Any]) -> list[dict[str, Any]]:
    lim, crawl, stream = _part(out, "limiter"), _part(out, "crawl"), _part(out, "llm_stream")
    return [
        _at_least(
            "limiter: one key sustains >= 200 permits/s",
            lim.get("permits_per_s"),
            LIMITER_MIN_PERMITS_PER_S,
        ),
        _below("limiter: grant latency p95 < 100 ms", lim.get("grant_p95_ms"), LIMITER_MAX_P95_MS),
        _at_least("crawl: pages/s ratio to Scrapy >= 0.8", crawl.get("ratio"), CRAWL_MIN_RATIO),
        _at_least("crawl: field agreement with Scrapy = 1.0", crawl.get("field_agreement"), 1.0),
        _at_least(
            "single page: ratio to httpx + BeautifulSoup >= 0.9",
            out.get("scrape_ratio_vs_direct"),
            PAGE_MIN_RATIO,
        ),
        _at_least(
            "article mode: ratio to trafilatura >= 0.9",
            out.get("article_ratio_vs_direct"),
            PAGE_MIN_RATIO,
        ),
        _at_least(
            "llm stream: tokens/s ratio to llama-server direct >= 0.95",
            stream.get("ratio"),
            LLM_STREAM_MIN_RATIO,
        ),
        _below(
            "llm stream: first-token overhead p50 < 50 ms",
            stream.get("first_token_overhead_ms"),
            LLM_FIRST_TOKEN_MAX_MS,
        ),
    ]


def _issue31(out: dict[str, Any]) -> list[dict[str, Any]]:
    browser, door = _part(out, "browser_hostile"), _part(out, "slowloris")
    during = _part(_part(out, "check_caps"), "during_ms")
    return [
        _below(
            "front door: /healthz p95 while a large pipeline is checked < 100 ms",
            during.get("p95"),
            HEALTHZ_MAX_MS,
        ),
        _check(
            "hostile page: worker RSS after/before <= 1.1",
            browser.get("ratio"),
            HOSTILE_MAX_RSS_RATIO,
            browser["ratio"] <= HOSTILE_MAX_RSS_RATIO if _number(browser.get("ratio")) else None,
        ),
        _check(
            "slow clients: front door fds after/before a burst <= 1.1",
            door.get("ratio"),
            HOSTILE_MAX_RSS_RATIO,
            door["ratio"] <= HOSTILE_MAX_RSS_RATIO if _number(door.get("ratio")) else None,
        ),
    ]


def print_report(out: dict[str, Any]) -> None:
    """The throughput, idle-latency, per-pipeline and targets tables (the first three
    only when the engine part's figures are on record)."""
    if out.get("throughput") and out.get("idle_latency") and out.get("per_pipeline"):
        _print_engine(out)
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


def _print_engine(out: dict[str, Any]) -> None:
    shapes = out.get("engine_shapes")
    if not isinstance(shapes, dict):  # figures from before the shapes
        shapes = {
            "validator": {
                "about": "validator steps local against bare regular activities",
                "cases": out["throughput"],
                "idle": out["idle_latency"],
                "per_pipeline": out["per_pipeline"],
            }
        }
    for key, shape in shapes.items():
        print(f"\n== {key}: {shape['about']}")
        _print_shape(shape)


def _print_shape(shape: dict[str, Any]) -> None:
    rows = []
    for c in shape["cases"]:
        rows.append(
            {
                "case": c["case"],
                "bare/s": c["bare_per_s"],
                "aiworker/s": c["aiworker_per_s"],
                "ratio": c["ratio"],
                "cpu ratio": c.get("worker_cpu_ratio", "n/a"),
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
        for case, i in shape["idle"].items()
    ]
    print("\nidle latency (one pipeline at a time)\n" + table(rows, list(rows[0])))
    rows = []
    for case, p in shape["per_pipeline"].items():
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


def _pair(o: dict[str, Any], b: dict[str, Any], key: str, fmt: Any = str) -> str:
    return f"{fmt(o[key])}/{fmt(b[key])}"


def _pcts(ms: dict[str, float]) -> str:
    return "/".join(f"{ms[k]:.0f}" for k in ("p50", "p95", "p99"))


def _ms(seconds: float) -> str:
    return "nan" if math.isnan(seconds) else f"{seconds * 1000:.1f}"
