"""``render: "browser"``: pages loaded in Debian's Chromium, every request through the fetcher.

Real Chromium, real loopback sites, the real worker runtime on the session's
Temporal server. Tests that need the browser skip, with the package to
install, where ``/usr/bin/chromium`` is absent (``.ci/run`` installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from support.loopback import HTML, Exchange, Loopback, serve
from support.payloads import stack_settings
from support.scraping import scrape_stack
from support.waiting import wait_until
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from aiworker.activities.errors import FetchFailedError, FetchTimeoutError
from aiworker.activities.tools import BrowserLimits, BrowserTool, EgressPolicy, scrape_tools
from aiworker.activities.tools.browser import CHROMIUM_ARGS
from aiworker.activities.tools.browser_gate import MAX_KEPT_URL
from aiworker.activities.tools.fetch import FetchTool
from aiworker.config.settings import Settings, parse_rate_limits
from aiworker.schemas.pipeline import PipelineResult

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Chromium is not installed: apt-get install chromium (Debian's package)",
)

JS_PAGE = b"""<!doctype html><html><head><title>App</title></head>
<body><div id="app"></div><script src="/app.js"></script></body></html>"""
APP_JS = b"""document.getElementById('app').innerHTML =
  '<h1>Rendered by script</h1><span class="price">12.50</span>';"""
DELAYED_PAGE = b"""<!doctype html><html><body><h1>Shell</h1><script>
setTimeout(() => { const p = document.createElement('p'); p.className = 'late';
  p.textContent = 'arrived late'; document.body.appendChild(p); }, 400);
</script></body></html>"""
NEVER_PAGE = b"""<!doctype html><html><body><h1>Waiting forever</h1></body></html>"""
API_PAGE = b"""<!doctype html><html><body><ul id="list"></ul><script>
fetch('/api/items.json').then(r => r.json()).then(items => {
  for (const i of items) { const li = document.createElement('li'); li.textContent = i;
    document.getElementById('list').appendChild(li); }
  document.body.insertAdjacentHTML('beforeend', '<p id="done">done</p>');
});
</script></body></html>"""

# After `load`: 192 MB on the JS heap (under the renderer's ceiling), then never yields.
HOSTILE_PAGE = b"""<!doctype html><html><body><h1>Hostile</h1><script>
addEventListener('load', () => setTimeout(() => {
  const hog = [];
  for (let i = 0; i < 48; i++) hog.push(new Array(512 * 1024).fill(i + 0.5));
  window.hog = hog;
  for (;;) {}
}, 0));
</script></body></html>"""
# 1.5 GiB of ArrayBuffers: outside V8's heap, inside the renderer's data limit.
BUFFERS_PAGE = b"""<!doctype html><html><body><h1>Buffers</h1><script>
const hog = [];
for (let i = 0; i < 24; i++) { const b = new Uint8Array(64 << 20); b.fill(1); hog.push(b); }
document.body.dataset.n = hog.length;
</script></body></html>"""
# 300 requests, each URL 100 KB long: what the render keeps of them is bounded.
LONG_URLS_PAGE = b"""<!doctype html><html><body><h1>Long</h1><script>
const tail = 'a'.repeat(100 * 1024);
Promise.allSettled(Array.from({length: 300}, (_, i) => fetch('/n/' + i + '?' + tail)))
  .then(() => document.body.insertAdjacentHTML('beforeend', '<p id="done">done</p>'));
</script></body></html>"""
# 1 GiB on the JS heap, twice the renderer's ceiling.
HOG_PAGE = b"""<!doctype html><html><body><h1>Hog</h1><script>
const hog = [];
for (let i = 0; i < 256; i++) hog.push(new Array(512 * 1024).fill(i + 0.5));
document.body.dataset.n = hog.length;
</script></body></html>"""


def mixed_page(denied_port: int) -> bytes:
    """Sub-resources the policy refuses, beside ones it allows; the page still renders."""
    return f"""<!doctype html><html><body><h1 id="t">Mixed</h1>
<img src="http://127.0.0.1:{denied_port}/pixel.png">
<script src="http://127.0.0.1:{denied_port}/tracker.js"></script>
<script src="/private/secret.js"></script>
<script src="/app2.js"></script>
<script>
try {{ new WebSocket('ws://127.0.0.1:{denied_port}/ws'); }} catch (e) {{}}
fetch('/api/items.json', {{method: 'POST', body: 'x'}}).catch(() => {{}});
</script></body></html>""".encode()


class JsSite:
    """A loopback site whose content appears only once scripts run; logs every request."""

    def __init__(self, denied_port: int = 0) -> None:
        self.denied_port = denied_port
        self.log: list[str] = []
        self.lock = threading.Lock()
        self.hang_started = threading.Event()
        self.server = Loopback(self.handle)

    def url(self, path: str) -> str:
        return self.server.url(path)

    def handle(self, ex: Exchange) -> None:
        with self.lock:
            self.log.append(f"{ex.method} {ex.path}")
        js = "application/javascript"
        routes: dict[str, tuple[bytes, str]] = {
            "/robots.txt": (b"User-agent: *\nDisallow: /private/\n", "text/plain"),
            "/js": (JS_PAGE, HTML),
            "/app.js": (APP_JS, js),
            "/delayed": (DELAYED_PAGE, HTML),
            "/never": (NEVER_PAGE, HTML),
            "/hostile": (HOSTILE_PAGE, HTML),
            "/hog": (HOG_PAGE, HTML),
            "/long": (LONG_URLS_PAGE, HTML),
            "/buffers": (BUFFERS_PAGE, HTML),
            "/api": (API_PAGE, HTML),
            "/api/items.json": (b'["one", "two"]', "application/json"),
            "/mixed": (mixed_page(self.denied_port), HTML),
            "/app2.js": (b"document.getElementById('t').dataset.ok = '1';", js),
            "/private/secret.js": (b"document.title = 'leaked';", js),
            "/hang": (
                b'<html><body><h1>x</h1><script src="/slow.js"></script></body></html>',
                HTML,
            ),
        }
        if ex.path == "/slow.js":
            self.hang_started.set()
            ex.stopping.wait(30)
            ex.send(200, b"", js)
            return
        if ex.path.startswith("/n/"):
            ex.send(404, b"")
            return
        if ex.path not in routes:
            ex.send(404, b"missing")
            return
        body, ctype = routes[ex.path]
        ex.send(200, body, ctype)


@pytest.fixture(scope="module")
def denied() -> Iterator[Loopback]:
    """A second loopback server: the egress policy of these tests never trusts it."""
    hits: Counter[str] = Counter()

    def handle(ex: Exchange) -> None:
        hits[ex.path] += 1
        ex.send(200, b"", "image/png")

    with serve(handle) as server:
        server.hits = hits  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def js_site(denied: Loopback) -> Iterator[JsSite]:
    site = JsSite(denied.port)
    site.server.start()
    try:
        yield site
    finally:
        site.server.stop()


def settings_for(tmp: Path, **kw: Any) -> Settings:
    return stack_settings(
        tmp,
        allow_private_networks=False,
        rate_limits=tuple(parse_rate_limits("web-scrape:*=100000/min")),
        **kw,
    )


def trusting(settings: Settings, site: JsSite) -> EgressPolicy:
    """Private networks off; only the JS site's exact address and port trusted."""
    return EgressPolicy.from_settings(settings, trusted_endpoints=[("127.0.0.1", site.server.port)])


@pytest.fixture(scope="module")
def client(env: Any) -> Client:
    c: Client = env.client
    return c


@pytest_asyncio.fixture(scope="module")
async def stack(
    client: Client, js_site: JsSite, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    settings = settings_for(tmp_path_factory.mktemp("browser"))
    async with scrape_stack(client, settings, egress=trusting(settings, js_site)) as s:
        yield s


def step(sid: str, url: str, fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    inp = {"url": url, "extraction_spec": {"fields": fields}, **extra.pop("input", {})}
    return {"id": sid, "worker": "web-scrape", "input": inp, "on_failure": "continue", **extra}


async def run(stack: Stack, steps: list[dict[str, Any]]) -> PipelineResult:
    pipeline = {"name": "browser-test", "tenant": "acme", "steps": steps}
    handle = await stack.start(pipeline)
    result: PipelineResult = await handle.result()
    return result


BROWSER = {"render": "browser"}


@needs_chromium
async def test_rendered_pages_through_a_pipeline(stack: Stack, js_site: JsSite) -> None:
    """Script-made content is found only when rendered; waits end inside the deadline."""
    h1 = {"h1": {"selector": "h1", "required": True}}
    result = await run(
        stack,
        [
            step("plain", js_site.url("/js"), h1),
            step(
                "rendered",
                js_site.url("/js"),
                {**h1, "price": {"selector": ".price", "type": "number"}},
                input=BROWSER,
            ),
            step(
                "delayed",
                js_site.url("/delayed"),
                {"late": {"selector": ".late", "required": True}},
                input={**BROWSER, "wait_for": "p.late"},
            ),
            step(
                "idle",
                js_site.url("/api"),
                {"items": {"selector": "li", "many": True}},
                input={**BROWSER, "wait_for": "networkidle"},
            ),
            step(
                "never",
                js_site.url("/never"),
                h1,
                # room for a browser start on a loaded machine (tests run in parallel)
                timeout_seconds=8,
                input={**BROWSER, "wait_for": ".never-there"},
                # after the other rendered steps: the process has 2 browser pages, and
                # time spent waiting for one would leave the wait less than its share
                depends_on=["rendered", "delayed", "idle", "mixed"],
            ),
            step(
                "mixed",
                js_site.url("/mixed"),
                {"ok": {"selector": "#t", "attr": "data-ok", "required": True}},
                input=BROWSER,
            ),
        ],
    )
    s = result.steps
    assert s["plain"].status == "partial"
    assert s["plain"].outputs is not None and s["plain"].outputs["data"]["h1"] is None
    assert s["rendered"].status == "succeeded", s["rendered"].error_message
    out = s["rendered"].outputs
    assert out is not None
    assert out["data"] == {"h1": "Rendered by script", "price": 12.5}
    assert out["source"]["browser"] == {"requests": 2, "fetched": 2, "blocked": {}}
    assert s["delayed"].status == "succeeded", s["delayed"].error_message
    assert s["delayed"].outputs is not None
    assert s["delayed"].outputs["data"] == {"late": "arrived late"}
    assert s["idle"].status == "succeeded", s["idle"].error_message
    assert s["idle"].outputs is not None
    assert s["idle"].outputs["data"] == {"items": ["one", "two"]}
    # A wait that never ends: partial with a warning, inside the step's 8 s.
    never = s["never"]
    assert never.status == "partial" and never.attempts == 1
    assert never.outputs is not None
    assert never.outputs["data"] == {"h1": "Waiting forever"}
    assert [w["code"] for w in never.outputs["warnings"]] == ["wait_for_timeout"]
    assert never.outputs["warnings"][0]["field"] == "input.wait_for"
    assert never.duration_ms is not None and never.duration_ms < 8000
    # Denied sub-resources blocked by reason; the page rendered all the same.
    mixed = s["mixed"]
    assert mixed.status == "succeeded", mixed.error_message
    assert mixed.outputs is not None
    assert mixed.outputs["data"] == {"ok": "1"}
    assert mixed.outputs["source"]["browser"]["blocked"] == {
        "egress_denied": 2,
        "method": 1,
        "robots": 1,
    }


@needs_chromium
async def test_a_hostile_page_in_a_pipeline_fails_fetch_timeout_inside_its_step(
    stack: Stack, js_site: JsSite
) -> None:
    """The page spins after ``load``: the step ends ``fetch_timeout`` (never ``internal``,
    never Temporal's own timeout) inside its 8 s, and the next rendered step works."""
    result = await run(
        stack,
        [
            step(
                "hostile",
                js_site.url("/hostile"),
                {"h1": "h1"},
                timeout_seconds=8,
                retry={"max_attempts": 1},
                input=BROWSER,
            ),
        ],
    )
    hostile = result.steps["hostile"]
    assert (hostile.status, hostile.error_code, hostile.attempts) == (
        "failed",
        "fetch_timeout",
        1,
    ), hostile.error_message
    assert "past the render's deadline" in (hostile.error_message or "")
    assert hostile.duration_ms is not None and hostile.duration_ms < 8000
    result = await run(stack, [step("after", js_site.url("/js"), {"h1": "h1"}, input=BROWSER)])
    after = result.steps["after"]
    assert after.status == "succeeded", after.error_message
    assert after.outputs is not None and after.outputs["data"] == {"h1": "Rendered by script"}


@needs_chromium
async def test_bad_browser_inputs_are_invalid_input(stack: Stack, js_site: JsSite) -> None:
    h1 = {"h1": "h1"}
    result = await run(
        stack,
        [
            step("no_render", js_site.url("/js"), h1, input={"wait_for": "h1"}),
            step("bad_selector", js_site.url("/js"), h1, input={**BROWSER, "wait_for": "h1[["}),
        ],
    )
    for sid in ("no_render", "bad_selector"):
        r = result.steps[sid]
        assert (r.status, r.error_code, r.attempts) == ("failed", "invalid_input", 1), sid
    assert 'only with "render": "browser"' in (result.steps["no_render"].error_message or "")
    assert "input.wait_for" in (result.steps["bad_selector"].error_message or "")
    assert "invalid CSS selector" in (result.steps["bad_selector"].error_message or "")
    # An unknown engine never starts: the pipeline check names step and field.
    with pytest.raises(WorkflowFailureError) as e:
        await run(stack, [step("bad_render", js_site.url("/js"), h1, input={"render": "firefox"})])
    cause = e.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "invalid_input"
    assert "step 'bad_render': field 'input.render'" in cause.message


async def test_missing_chromium_is_a_non_retryable_error_naming_the_package(
    client: Client, js_site: JsSite, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, browser_executable=tmp_path / "no-such-chromium")
    tools = scrape_tools(settings, egress=trusting(settings, js_site))
    try:
        async with running_stack(client, settings, tools=tools) as s:
            result = await run(s, [step("render", js_site.url("/js"), {"h1": "h1"}, input=BROWSER)])
    finally:
        await tools["render"].aclose()
        await tools["fetch_url"].aclose()
    r = result.steps["render"]
    assert (r.status, r.error_code, r.attempts) == ("failed", "tool_not_allowed", 1)
    assert "apt-get install chromium" in (r.error_message or "")
    assert "no-such-chromium" in (r.error_message or "")


def _browser_pids(tool: BrowserTool, proxy: str | None = None) -> list[int]:
    """``tool``'s Chromium browser process (not its renderers): the one given its proxy."""
    proxy = proxy or tool.proxy
    me = os.getpid()
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out = []
    for pid in parents:
        p = pid
        for _ in range(10):
            p = parents.get(p, 0)
            if p == me:
                break
        else:
            continue
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            cmd
            and cmd[0].endswith(b"chromium")
            and not any(a.startswith(b"--type=") for a in cmd)
            and f"--proxy-server={proxy}".encode() in cmd
        ):
            out.append(pid)
    return out


@pytest_asyncio.fixture
async def tool(js_site: JsSite, tmp_path: Path) -> AsyncIterator[BrowserTool]:
    settings = settings_for(tmp_path)
    fetcher = FetchTool(trusting(settings, js_site))
    browser = BrowserTool(fetcher, CHROMIUM, BrowserLimits())
    try:
        yield browser
    finally:
        await browser.aclose()
        await fetcher.aclose()


@needs_chromium
async def test_every_request_the_browser_made_went_through_the_fetcher(
    tool: BrowserTool, js_site: JsSite, denied: Loopback
) -> None:
    with js_site.lock:
        js_site.log.clear()
    page = await tool.render(js_site.url("/mixed"), timeout=20)
    with js_site.lock:
        served = Counter(js_site.log)
    fetched = Counter(
        f"{r['method']} {r['url'].removeprefix(js_site.server.base_url)}"
        for r in page.requests
        if r["outcome"] in ("document", "fetched")
    )
    # Everything the site served was asked for by the fetcher (robots.txt is the
    # fetcher's own), exactly as often; nothing reached the denied server.
    assert served - Counter({"GET /robots.txt": served["GET /robots.txt"]}) == fetched
    assert fetched == Counter({"GET /mixed": 1, "GET /app2.js": 1})
    assert denied.hits == {}  # type: ignore[attr-defined]
    # Chromium's own start-up calls (update.googleapis.com, accounts.google.com in
    # Chromium 156, flags notwithstanding) end at the sinkhole; none of the page's did.
    port_marks = (f":{js_site.server.port}", f":{denied.port}", "127.0.0.1")
    assert [line for line in tool.escaped if any(m in line for m in port_marks)] == []
    outcomes = sorted(r["outcome"] for r in page.requests if r["outcome"].startswith("blocked"))
    assert outcomes == [
        "blocked:egress_denied",
        "blocked:egress_denied",
        "blocked:method",
        "blocked:robots",
    ]


@needs_chromium
async def test_chromium_runs_with_background_traffic_off_and_a_fresh_profile(
    tool: BrowserTool, js_site: JsSite
) -> None:
    await tool.render(js_site.url("/js"), timeout=20)
    proxy = tool.proxy
    [pid] = _browser_pids(tool)
    args = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")
    for flag in CHROMIUM_ARGS:
        assert flag in args
    assert any(a.startswith("--proxy-server=http://127.0.0.1:") for a in args)
    assert any(a.startswith("--user-data-dir=") for a in args)
    profile = Path(next(a for a in args if a.startswith("--user-data-dir=")).split("=", 1)[1])
    assert await asyncio.to_thread(profile.is_dir)
    # Running as root, the sandbox is off (Chromium refuses it as root).
    assert ("--no-sandbox" in args) == (os.geteuid() == 0)
    await tool.aclose()
    assert not await asyncio.to_thread(profile.exists)
    assert _browser_pids(tool, proxy) == []


@needs_chromium
async def test_a_browser_that_crashes_fails_the_call_and_is_relaunched(
    tool: BrowserTool, js_site: JsSite
) -> None:
    js_site.hang_started.clear()
    call = asyncio.create_task(tool.render(js_site.url("/hang"), timeout=20))
    await asyncio.to_thread(js_site.hang_started.wait, 10)
    proxy = tool.proxy
    [pid] = _browser_pids(tool)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(FetchFailedError) as e:
        await asyncio.wait_for(call, 15)
    assert e.value.retryable
    assert e.value.context["reason"] == "browser_crashed"
    await wait_until(
        lambda: pid not in _browser_pids(tool, proxy), "the killed browser to be gone", timeout=5
    )
    page = await tool.render(js_site.url("/js"), timeout=20)
    assert "Rendered by script" in page.html
    assert tool.launches == 2


def _tree(root: int) -> dict[int, tuple[list[bytes], int]]:
    """Descendants of ``root``: pid -> (cmdline, RSS bytes), read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out: dict[int, tuple[list[bytes], int]] = {}
    for pid in parents:
        p = pid
        while p not in (0, 1, root):
            p = parents.get(p, 0)
        if p != root or pid == root:
            continue
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
            rss = int((Path("/proc") / str(pid) / "statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out[pid] = (cmd, rss * os.sysconf("SC_PAGE_SIZE"))
    return out


def _renderers(browser: int) -> set[int]:
    """The renderer processes under the ``browser`` process (Chromium rewrites a
    child's command line into one string). Other tests' browsers have their own."""
    return {
        pid
        for pid, (cmd, _) in _tree(browser).items()
        if b"chromium" in cmd[0] and b" --type=renderer " in b" ".join(cmd) + b" "
    }


def _tree_rss() -> int:
    me = int((Path("/proc/self/statm")).read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return me + sum(rss for _, rss in _tree(os.getpid()).values())


async def _settled(browser: int) -> None:
    """Wait until no renderer of ``browser`` runs: a closed context's renderer exits a
    moment later."""
    await wait_until(lambda: not _renderers(browser), "no renderer process left", timeout=5)


async def _hostile_render(
    tool: BrowserTool, js_site: JsSite, deadline: float, seen: set[int] | None = None
) -> None:
    """Render the hostile page; fail the test unless the call ends by its deadline + slack.
    ``seen`` collects the browser's processes while the page runs."""
    call = asyncio.create_task(tool.render(js_site.url("/hostile"), timeout=deadline))
    if seen is not None:
        await wait_until(
            lambda: any(_renderers(pid) for pid in _browser_pids(tool)),
            "the hostile page's renderer",
            timeout=10,
        )
        [pid] = _browser_pids(tool)
        seen |= {pid, *_tree(pid)}
    done, _ = await asyncio.wait({call}, timeout=deadline + 5)
    if not done:
        call.cancel()
        await asyncio.wait({call}, timeout=10)
        pytest.fail(f"the hostile render was still running {deadline + 5:.0f} s after its start")
    with pytest.raises(FetchTimeoutError) as e:
        call.result()
    assert e.value.retryable and e.value.context["reason"] == "render_deadline"


@needs_chromium
async def test_a_hostile_page_ends_at_its_deadline_and_leaves_no_renderer(
    tool: BrowserTool, js_site: JsSite
) -> None:
    """A page that allocates and spins after ``load``: the render fails ``fetch_timeout``
    by its deadline, its renderer is gone, memory comes back, the next render works."""
    page = await tool.render(js_site.url("/js"), timeout=20)
    assert "Rendered by script" in page.html
    [browser] = _browser_pids(tool)
    await _settled(browser)
    rss_before = _tree_rss()
    await _hostile_render(tool, js_site, deadline=4.0)
    await _settled(browser)  # the spinning renderer is gone, not left holding memory
    rss_after = _tree_rss()
    ratio = rss_after / rss_before
    print(f"worker tree RSS after/before a hostile page: {ratio:.3f}")
    assert ratio < 1.10, (rss_before, rss_after)
    page = await tool.render(js_site.url("/js"), timeout=20)
    assert "Rendered by script" in page.html


@needs_chromium
async def test_a_close_that_does_not_return_in_time_kills_the_browser_tree(
    js_site: JsSite, tmp_path: Path
) -> None:
    """``close_seconds`` too short for any close: the browser's whole process tree is
    killed by PID, and the next call launches a new browser."""
    settings = settings_for(tmp_path)
    fetcher = FetchTool(trusting(settings, js_site))
    tool = BrowserTool(fetcher, CHROMIUM, BrowserLimits(close_seconds=0.001))
    try:
        tree: set[int] = set()
        await _hostile_render(tool, js_site, deadline=4.0, seen=tree)
        assert tool.kills == 1
        await wait_until(
            lambda: not tree & set(_tree(os.getpid())),
            "the killed browser tree to be gone",
            timeout=5,
        )
        page = await tool.render(js_site.url("/js"), timeout=20)
        assert "Rendered by script" in page.html
        assert tool.launches >= 2
    finally:
        await tool.aclose()
        await fetcher.aclose()


@needs_chromium
async def test_a_page_over_the_memory_ceiling_crashes_only_its_renderer(
    tool: BrowserTool, js_site: JsSite
) -> None:
    """1 GiB of JS heap against a 512 MB ceiling: ``fetch_failed`` (renderer_crashed),
    the same browser renders the next page."""
    await tool.render(js_site.url("/js"), timeout=20)
    [browser] = _browser_pids(tool)
    renderers_before = _renderers(browser)
    with pytest.raises(FetchFailedError) as e:
        await asyncio.wait_for(tool.render(js_site.url("/hog"), timeout=20), 30)
    assert e.value.retryable and e.value.context["reason"] == "renderer_crashed"
    assert "512 MB" in str(e.value)
    await wait_until(
        lambda: _renderers(browser) <= renderers_before,
        "the crashed renderer to be gone",
        timeout=5,
    )
    page = await tool.render(js_site.url("/js"), timeout=20)
    assert "Rendered by script" in page.html
    assert (tool.launches, tool.kills) == (1, 0)


@needs_chromium
async def test_what_a_render_keeps_of_its_requests_is_bounded(
    tool: BrowserTool, js_site: JsSite
) -> None:
    """300 requests with 100 KB URLs: the first ``max_requests`` are kept, URLs cut to
    ``MAX_KEPT_URL``; the summary still counts them all."""
    page = await tool.render(js_site.url("/long"), wait_for="#done", timeout=30)
    assert page.waited
    assert len(page.requests) == tool.limits.max_requests
    assert max(len(r["url"]) for r in page.requests) == MAX_KEPT_URL
    summary = page.summary()
    assert summary["requests"] == 301
    assert summary["blocked"] == {"quota": 301 - tool.limits.max_requests}


@needs_chromium
async def test_array_buffers_past_the_renderer_data_limit_fail_to_allocate(
    tool: BrowserTool, js_site: JsSite
) -> None:
    """1.5 GiB of ArrayBuffers (not on V8's heap) against a 1 GiB renderer: the page's
    allocation fails, the page renders without it."""
    page = await tool.render(js_site.url("/buffers"), timeout=20)
    assert "<h1>Buffers</h1>" in page.html
    assert "data-n" not in page.html


class Tarpit:
    """A loopback server that accepts connections and never answers; counts those open
    (and the most open at once) until :meth:`release` closes them all, and every later
    one as it comes."""

    def __init__(self) -> None:
        self.open: set[asyncio.StreamWriter] = set()
        self.peak = 0
        self.port = 0
        self.released = asyncio.Event()

    async def _take(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.released.is_set():
            writer.close()
            return
        self.open.add(writer)
        self.peak = max(self.peak, len(self.open))
        released = asyncio.ensure_future(self.released.wait())
        try:
            # Held until released, or until the client closes its end (read to EOF).
            while not released.done():
                read = asyncio.ensure_future(reader.read(65536))
                await asyncio.wait({read, released}, return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    read.cancel()
                elif not read.result():
                    break
        except ConnectionError:
            pass
        finally:
            released.cancel()
            self.open.discard(writer)
            writer.close()

    def release(self) -> None:
        self.released.set()


@contextlib.asynccontextmanager
async def tarpit() -> AsyncIterator[Tarpit]:
    pit = Tarpit()
    server = await asyncio.start_server(pit._take, "127.0.0.1", 0)
    pit.port = server.sockets[0].getsockname()[1]
    try:
        yield pit
    finally:
        pit.release()
        server.close()
        await server.wait_closed()


# 150 images on distinct host names, every one served by the tarpit (issue 47).
TARPIT_HOSTS = 150


def tarpit_page(port: int) -> bytes:
    imgs = "".join(
        f'<img src="http://img{i}.tarpit.test:{port}/p.png">' for i in range(TARPIT_HOSTS)
    )
    return f"<!doctype html><html><body><h1>Hostile</h1>{imgs}</body></html>".encode()


@needs_chromium
async def test_a_render_of_150_tarpit_images_leaves_another_tenants_fetch_alone(
    client: Client, tmp_path: Path
) -> None:
    """Tenant acme renders a page whose 150 images (each on its own host name) point at
    a server that never answers; while that render is still held there, tenant globex's
    plain scrape in the same worker process gets a connection and succeeds. Before: the
    render's sub-requests took the process's whole pool (100 connections) and globex's
    fetch waited for one until its own deadline (``fetch_timeout``)."""
    cap = BrowserLimits().max_in_flight
    async with tarpit() as pit:
        pages = {"/hostile": tarpit_page(pit.port), "/plain": b"<html><h1>Plain</h1></html>"}

        def handle(ex: Exchange) -> None:
            body = pages.get(ex.path)
            ex.send(200 if body else 404, body or b"", HTML)

        with serve(handle) as site:

            async def to_loopback(host: str, port: int) -> list[str]:
                if host.endswith(".tarpit.test"):
                    return ["127.0.0.1"]
                raise OSError(f"no such host in this test: {host}")

            settings = settings_for(tmp_path)
            egress = EgressPolicy.from_settings(
                settings,
                trusted_endpoints=[("127.0.0.1", site.port), ("127.0.0.1", pit.port)],
                resolver=to_loopback,
            )
            async with scrape_stack(client, settings, egress=egress) as s:
                h1 = {"h1": {"selector": "h1", "required": True}}
                hostile = await s.start(
                    {
                        "name": "hostile-render",
                        "tenant": "acme",
                        "steps": [
                            step(
                                "render",
                                site.url("/hostile"),
                                h1,
                                timeout_seconds=120,
                                retry={"max_attempts": 1},
                                input={**BROWSER, "respect_robots": False},
                            )
                        ],
                    }
                )
                # The render holds all the connections it will take at the tarpit: its
                # cap's worth, and the count steady (before the cap: the whole pool).
                seen: list[int] = []

                def steady() -> bool:
                    seen.append(len(pit.open))
                    last = seen[-5:]
                    return last[0] >= cap and len(last) == 5 and len(set(last)) == 1

                await wait_until(
                    steady,
                    lambda: f"the render to hold connections steadily (open: {seen[-5:]})",
                    timeout=60,
                    interval=0.2,
                )
                plain = await s.start(
                    {
                        "name": "plain-fetch",
                        "tenant": "globex",
                        "steps": [
                            step(
                                "fetch",
                                site.url("/plain"),
                                h1,
                                # far above a loopback fetch, below the tarpit's hold on
                                # the render's requests (their 30 s read timeout)
                                timeout_seconds=15,
                                retry={"max_attempts": 1},
                                input={"respect_robots": False},
                            )
                        ],
                    }
                )
                result: PipelineResult = await plain.result()
                fetched = result.steps["fetch"]
                assert fetched.status == "succeeded", (
                    fetched.error_code,
                    fetched.error_message,
                    len(pit.open),
                )
                assert fetched.outputs is not None and fetched.outputs["data"] == {"h1": "Plain"}
                # ...while the hostile render was still in flight, held at the tarpit.
                assert not pit.released.is_set() and pit.open
                described = await hostile.describe()
                assert described.status == WorkflowExecutionStatus.RUNNING
                # A render holds no more than its cap of sub-requests at once.
                assert pit.peak <= cap
                pit.release()  # every image now fails at once; the page loads without them
                done: PipelineResult = await hostile.result()
                rendered = done.steps["render"]
                assert rendered.status == "succeeded", rendered.error_message
                assert rendered.outputs is not None
                assert rendered.outputs["data"] == {"h1": "Hostile"}
