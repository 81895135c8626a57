"""Worker memory after a hostile page: RSS after/before, and normal renders around it.

A loopback site serves a script-rendered page and a hostile one (192 MB on the
JavaScript heap after ``load``, then ``for(;;){}``). One ``BrowserTool`` (Debian's
Chromium) renders the normal page ``n`` times (its latency, p50), then the
hostile page under a 4 s deadline, then the normal page ``n`` times again.
RSS is the sum over this process and all its children (Playwright's driver,
Chromium and its renderers), read from ``/proc`` once no renderer runs. The
headline ``ratio`` is RSS after/before the hostile page (issue #31: within 10%).
Before issue #31's fix the hostile render never returned (its cleanup waited on
the spinning renderer), so this bench did not finish there.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from aiworker.activities.errors import WorkerError
from aiworker.activities.tools import BrowserTool, EgressPolicy
from aiworker.activities.tools.fetch import FetchTool
from bench.common import standalone

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.loopback import HTML, Exchange, serve
from support.waiting import wait_until

CHROMIUM = Path("/usr/bin/chromium")
HAVE_CHROMIUM = CHROMIUM.exists()
PAGES = {
    "/js": (
        b'<!doctype html><html><body><div id="app"></div><script src="/app.js"></script>'
        b"</body></html>",
        HTML,
    ),
    "/app.js": (
        b"document.getElementById('app').innerHTML = '<h1>Rendered</h1>';",
        "application/javascript",
    ),
    "/hostile": (
        b"""<!doctype html><html><body><h1>Hostile</h1><script>
addEventListener('load', () => setTimeout(() => {
  const hog = [];
  for (let i = 0; i < 48; i++) hog.push(new Array(512 * 1024).fill(i + 0.5));
  window.hog = hog;
  for (;;) {}
}, 0));
</script></body></html>""",
        HTML,
    ),
}
DEADLINE = 4.0


def _handle(ex: Exchange) -> None:
    if ex.path not in PAGES:
        ex.send(404, b"")
        return
    body, ctype = PAGES[ex.path]
    ex.send(200, body, ctype)


def _tree() -> dict[int, tuple[bytes, int]]:
    """Descendants of this process: pid -> (command line, RSS bytes)."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    parents[int(entry.name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except OSError:
                continue
    me, page = os.getpid(), os.sysconf("SC_PAGE_SIZE")
    out: dict[int, tuple[bytes, int]] = {}
    for pid in parents:
        p = pid
        while p not in (0, 1, me):
            p = parents.get(p, 0)
        if p != me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
            with open(f"/proc/{pid}/statm", "rb") as f:
                rss = int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        out[pid] = (cmd, rss)
    return out


def _renderers() -> int:
    return sum(1 for cmd, _ in _tree().values() if b" --type=renderer " in cmd + b" ")


async def _rss_settled() -> int:
    """RSS of the process tree once no renderer runs (bounded wait, 10 s)."""
    await wait_until(lambda: not _renderers(), "no renderer process left", timeout=10)
    with open("/proc/self/statm", "rb") as f:
        me = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return me + sum(rss for _, rss in _tree().values())


async def run(quick: bool) -> dict[str, Any]:
    n = 5 if quick else 20
    if not HAVE_CHROMIUM:
        return {"skipped": "Chromium is not installed: apt-get install chromium"}
    with serve(_handle) as site:
        fetcher = FetchTool(EgressPolicy(allow_private_networks=True))
        tool = BrowserTool(fetcher, CHROMIUM)
        try:
            await tool.render(site.url("/js"), timeout=20)  # the browser's start

            async def normal() -> list[float]:
                out = []
                for _ in range(n):
                    t = time.perf_counter()
                    await tool.render(site.url("/js"), timeout=20)
                    out.append((time.perf_counter() - t) * 1000)
                return out

            before_ms = await normal()
            rss_before = await _rss_settled()
            t = time.perf_counter()
            try:
                await asyncio.wait_for(tool.render(site.url("/hostile"), timeout=DEADLINE), 30)
                outcome = "rendered"
            except WorkerError as e:
                outcome = f"{e.code.value}:{e.context.get('reason', '')}"
            except TimeoutError:
                outcome = "still running after 30 s"
            hostile_s = time.perf_counter() - t
            rss_after = await _rss_settled()
            renderers_left = _renderers()
            after_ms = await normal()
        finally:
            await tool.aclose()
            await fetcher.aclose()
    return {
        "ratio": round(rss_after / rss_before, 3),
        "command": "BENCH_QUICK=1 .venv/bin/python -m bench.browser_hostile",
        "rss_before_mb": round(rss_before / 2**20),
        "rss_after_mb": round(rss_after / 2**20),
        "hostile_outcome": outcome,
        "hostile_seconds": round(hostile_s, 2),
        "hostile_deadline_seconds": DEADLINE,
        "renderers_left": renderers_left,
        "renders": n,
        "normal_render_p50_ms_before": round(statistics.median(before_ms), 1),
        "normal_render_p50_ms_after": round(statistics.median(after_ms), 1),
        "browser_launches": tool.launches,
        "browser_kills": getattr(tool, "kills", None),
    }


if __name__ == "__main__":
    standalone(run)
