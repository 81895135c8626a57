"""``make bench``: run every benchmark, print a table, write bench/results/latest.json.

``BENCH_QUICK=1`` runs a reduced version. Figures are ratios against a
baseline measured in the same run, or counts: the machine is shared and noisy.
The ``targets`` block states issue 17's targets with ``met`` from this run's figures.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench import overhead, throughput
from bench.report import print_report, targets

RESULTS = Path(__file__).parent / "results"


async def main() -> int:
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    started = time.time()
    out: dict[str, Any] = {
        "quick": quick,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    ov = await overhead.run(quick)
    out["runtime_overhead"] = ov
    out["runtime_overhead_p50_us"] = round(ov["overhead_p50_us"], 1)
    tp = await throughput.run(quick)
    out["throughput"] = tp["cases"]
    one = next(c for c in tp["cases"] if c["case"] == "chain-1")
    out["throughput_ratio_vs_bare"] = round(one["ratio"], 3)
    out["idle_latency_ratio_vs_bare"] = {case: i["ratio"] for case, i in tp["idle"].items()}
    out["idle_latency"] = tp["idle"]
    out["per_pipeline"] = tp["per_pipeline"]
    for name, key in (
        ("bench.scrape", "scrape"),
        ("bench.article", "article"),
        ("bench.foreach", "for_each"),
    ):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            out[key] = {"skipped": f"{name} not present"}
            continue
        res = mod.run(quick)
        out[key] = await res if asyncio.iscoroutine(res) else res
    if isinstance(out.get("scrape"), dict) and "scrape_ratio_vs_direct" in out["scrape"]:
        out["scrape_ratio_vs_direct"] = out["scrape"]["scrape_ratio_vs_direct"]
    else:
        out["scrape_ratio_vs_direct"] = None
    article = out.get("article")
    out["article_ratio_vs_direct"] = (
        article.get("article_ratio_vs_direct") if isinstance(article, dict) else None
    )
    out["wall_seconds"] = round(time.time() - started, 1)

    out["targets"] = targets(out)

    print_report(out)
    print(
        f"\nruntime overhead per call: p50 {ov['overhead_p50_us']:.0f} us, "
        f"p99 {ov['overhead_p99_us']:.0f} us (direct p50 {ov['direct_us']['p50']:.0f} us, "
        f"through runtime p50 {ov['runtime_us']['p50']:.0f} us)"
    )
    print(f"throughput_ratio_vs_bare (one step): {out['throughput_ratio_vs_bare']}")
    print(f"scrape_ratio_vs_direct: {out['scrape_ratio_vs_direct']}")
    print(f"article_ratio_vs_direct: {out['article_ratio_vs_direct']}")
    print(f"for_each: {json.dumps(out.get('for_each'))}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"written {RESULTS / 'latest.json'} in {out['wall_seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
