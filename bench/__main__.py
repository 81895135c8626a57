"""``make bench``: run every benchmark, print a table, write bench/results/latest.json.

``BENCH_QUICK=1`` runs a reduced version. Figures are ratios against a
baseline measured in the same run, or counts: the machine is shared and noisy.
The ``targets`` block states the targets (issues 17 and 29) with ``met`` from the
figures on record.

``BENCH_ONLY=crawl,limiter`` runs only the named parts (``engine`` is the runtime
overhead and throughput shapes; the others are the keys below) and replaces just
their keys in the existing latest.json: each part's ratios compare against a
baseline measured inside that part's own run, so parts run at different times
stay comparable. ``measured_at`` says when each key was last measured.

A part that raises does not stop the bench: its key holds ``{"failed": "<error>"}``
(with the figures it had before under ``previous``, when a ``BENCH_ONLY`` run
replaced them), ``failed_parts`` names it with its error, and the bench exits 1 at
the end. latest.json is written after each part, so a bench killed midway keeps
what it measured.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench import overhead, throughput
from bench.report import print_report, targets

RESULTS = Path(__file__).parent / "results"

# (module, key in latest.json): each exposes run(quick) -> dict (sync or async)
PARTS = (
    ("bench.scrape", "scrape"),
    ("bench.article", "article"),
    ("bench.foreach", "for_each"),
    ("bench.limiter", "limiter"),
    ("bench.crawl", "crawl"),
    ("bench.scale_out", "scale_out"),
    ("bench.llm_stream", "llm_stream"),
    ("bench.browser_hostile", "browser_hostile"),
    ("bench.slowloris", "slowloris"),
    ("bench.check_caps", "check_caps"),
    ("bench.otlp_export", "otlp_export"),
    ("bench.callback", "callback"),
    ("bench.events", "events"),
    ("bench.mcp_tools", "mcp_tools"),
    ("bench.flow", "flow"),
    ("bench.eval", "eval"),
    ("bench.quote", "quote"),
    ("bench.schemas", "schemas"),
)
ENGINE = "engine"


def _selected() -> set[str] | None:
    raw = os.environ.get("BENCH_ONLY", "").strip()
    if not raw:
        return None
    chosen = {p.strip() for p in raw.split(",") if p.strip()}
    known = {ENGINE} | {key for _, key in PARTS}
    unknown = chosen - known
    if unknown:
        raise SystemExit(
            f"BENCH_ONLY: unknown part(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )
    return chosen


async def _engine(out: dict[str, Any], quick: bool) -> None:
    ov = await overhead.run(quick)
    out["runtime_overhead"] = ov
    out["runtime_overhead_p50_us"] = round(ov["overhead_p50_us"], 1)
    tp = await throughput.run(quick)
    head = tp["validator"]  # the first headline's keys, kept as they were
    out["throughput"] = head["cases"]
    one = next(c for c in head["cases"] if c["case"] == "chain-1")
    out["throughput_ratio_vs_bare"] = round(one["ratio"], 3)
    out["idle_latency_ratio_vs_bare"] = {case: i["ratio"] for case, i in head["idle"].items()}
    out["idle_latency"] = head["idle"]
    out["per_pipeline"] = head["per_pipeline"]
    # every shape, like against like (bench.throughput.SHAPES), each under its own keys
    out["engine_shapes"] = tp
    for key in ("regular", "regular_unsandboxed", "local"):
        shape = tp[key]
        out[f"throughput_ratio_{key}"] = {c["case"]: round(c["ratio"], 3) for c in shape["cases"]}
        out[f"worker_cpu_ratio_{key}"] = {c["case"]: c["worker_cpu_ratio"] for c in shape["cases"]}
        out[f"idle_latency_ratio_{key}"] = {case: i["ratio"] for case, i in shape["idle"].items()}
        out[f"per_pipeline_{key}"] = {
            case: p["aiworker_vs_bare"] for case, p in shape["per_pipeline"].items()
        }


def _failed(previous: Any, error: BaseException) -> dict[str, Any]:
    """A failed part's entry: the error, and the figures it had before (if any)."""
    entry: dict[str, Any] = {"failed": f"{type(error).__name__}: {error}"}
    if isinstance(previous, dict):
        before = previous.get("previous") if "failed" in previous else previous
        if before is not None:
            entry["previous"] = before
    return entry


def _write(out: dict[str, Any], started: float) -> None:
    """latest.json as measured so far (the targets from the figures on record)."""
    out["wall_seconds"] = round(time.time() - started, 1)
    scrape, article = out.get("scrape"), out.get("article")
    out["scrape_ratio_vs_direct"] = (
        scrape.get("scrape_ratio_vs_direct") if isinstance(scrape, dict) else None
    )
    out["article_ratio_vs_direct"] = (
        article.get("article_ratio_vs_direct") if isinstance(article, dict) else None
    )
    out["targets"] = targets(out)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(out, indent=2, default=str) + "\n")


async def main() -> int:
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    only = _selected()
    started = time.time()
    latest = RESULTS / "latest.json"
    out: dict[str, Any] = {}
    if only is not None and latest.exists():
        out = json.loads(latest.read_text())
    out.update({"quick": quick, "python": platform.python_version(), "cpus": os.cpu_count()})
    measured: dict[str, str] = dict(out.get("measured_at") or {})
    out["measured_at"] = measured
    failures: dict[str, str] = {}  # this run's
    earlier = out.get("failed_parts")
    out["failed_parts"] = recorded = {
        k: v
        for k, v in (earlier if isinstance(earlier, dict) else {}).items()
        if only is not None and k not in only
    }
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if only is None or ENGINE in only:
        try:
            await _engine(out, quick)
        except Exception as e:  # the other parts' figures still count
            traceback.print_exc()
            failures[ENGINE] = recorded[ENGINE] = f"{type(e).__name__}: {e}"
        else:
            measured[ENGINE] = stamp
        _write(out, started)
    for name, key in PARTS:
        if only is not None and key not in only:
            continue
        try:
            mod = importlib.import_module(name)
        except ImportError:
            out[key] = {"skipped": f"{name} not present"}
            continue
        try:
            res = mod.run(quick)
            out[key] = await res if asyncio.iscoroutine(res) else res
        except Exception as e:  # the other parts' figures still count
            traceback.print_exc()
            out[key] = _failed(out.get(key), e)
            failures[key] = recorded[key] = out[key]["failed"]
        else:
            measured[key] = stamp
        _write(out, started)
    _write(out, started)

    print_report(out)
    ov = out.get("runtime_overhead")
    if isinstance(ov, dict) and ENGINE not in failures:
        print(
            f"\nruntime overhead per call: p50 {ov['overhead_p50_us']:.0f} us, "
            f"p99 {ov['overhead_p99_us']:.0f} us (direct p50 {ov['direct_us']['p50']:.0f} us, "
            f"through runtime p50 {ov['runtime_us']['p50']:.0f} us)"
        )
    print(f"throughput_ratio_vs_bare (one step): {out.get('throughput_ratio_vs_bare')}")
    for key in ("scrape_ratio_vs_direct", "article_ratio_vs_direct"):
        print(f"{key}: {out.get(key)}")
    for _, key in PARTS[2:]:
        part = out.get(key)
        print(f"{key}: {json.dumps(part, default=str)[:400] if part is not None else None}")
    print(f"written {latest} in {out['wall_seconds']}s")
    if failures:
        print(f"FAILED parts: {', '.join(failures)}", file=sys.stderr)
        for key, error in failures.items():
            print(f"  {key}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
