"""Fuzzing compressed bodies through the web-scrape worker (issue 15, item 3).

Hypothesis generates (derandomized) bodies: pages, random bytes and bombs of
zeros, compressed with zero to three codings (gzip, deflate zlib-wrapped or
raw, br, and codings nobody decodes), then cut short, bit-flipped or padded
with garbage, under a ``Content-Encoding`` that matches, lies or is random
text; served as the page or as its site's robots.txt by a loopback server
of its own. Each case is fetched by the web-scrape worker, as a real
pipeline on the Temporal server and, for more cases, through the worker
runtime alone. Each must end in success or a stable code that is not
``internal``, with no failed workflow task, and the fetch tool's
:class:`BodyMeter` must show that no decoder produced more than its cap plus
one piece (``CHUNK``).
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import brotli
import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from hypothesis import strategies as st
from support.bodies import metered_scrape, send_encoded
from support.fuzzing import generate, outcome, show
from support.loopback import HTML, Exchange, Loopback
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from aiworker.activities.bodies import CHUNK, BodyMeter
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools import FetchLimits
from aiworker.activities.web_scrape import WebScrape
from aiworker.config.catalog import load_specs
from aiworker.schemas.errors import ErrorCode

# Small caps so that a bomb passes them cheaply; the bound is the same at any cap.
LIMITS = FetchLimits(max_bytes=256 * 1024, robots_max_bytes=64 * 1024)
STABLE = {c.value for c in ErrorCode} - {ErrorCode.INTERNAL.value}
PAGE = "<html><body><h1>{}</h1></body></html>"
CODINGS = ["gzip", "x-gzip", "deflate", "deflate-raw", "br", "identity", "zstd", "compress"]


@functools.cache
def zeros(n: int) -> bytes:
    return bytes(n)


def encode(data: bytes, coding: str) -> bytes:
    """``data`` in ``coding``; codings nobody decodes leave it as it is (the header lies)."""
    if coding in ("gzip", "x-gzip"):
        return gzip.compress(data, 6)
    if coding == "deflate":
        return zlib.compress(data, 6)
    if coding == "deflate-raw":
        c = zlib.compressobj(6, zlib.DEFLATED, -15)
        return c.compress(data) + c.flush()
    if coding == "br":
        return brotli.compress(data, quality=4)
    return data


contents = st.one_of(
    st.builds(lambda t: {"page": t}, st.text(max_size=200)),
    st.builds(lambda b: {"bytes": b.hex()}, st.binary(max_size=2000)),
    # Bombs: a few KiB to 32 MiB of zeros, far past the 256 KiB cap once decoded.
    st.builds(lambda n: {"zeros": n}, st.sampled_from([0, 1, 4096, 300_000, 4 << 20, 32 << 20])),
)
mutations = st.one_of(
    st.just({}),
    st.builds(lambda k: {"cut": k}, st.integers(1, 40)),
    st.builds(lambda i: {"flip": i}, st.integers(0, 400)),
    st.builds(lambda b: {"pad": b.hex()}, st.binary(min_size=1, max_size=64)),
)
header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=0, max_size=30
)
bodies = st.fixed_dictionaries(
    {
        "content": contents,
        "codings": st.lists(st.sampled_from(CODINGS), max_size=3),
        "mutation": mutations,
        # None: the header names the codings applied, in HTTP order; a string: it lies.
        "header": st.none() | st.none() | header_text | st.sampled_from(["gzip, gzip", "br,br"]),
        "as_robots": st.booleans() | st.just(False),
    }
)


def build(case: dict[str, Any]) -> tuple[bytes, list[str]]:
    """The body bytes and the ``Content-Encoding`` header lines of ``case``."""
    content = case["content"]
    if "page" in content:
        data = PAGE.format(content["page"]).encode()
    elif "bytes" in content:
        data = bytes.fromhex(content["bytes"])
    else:
        data = zeros(content["zeros"])
    for coding in case["codings"]:
        data = encode(data, coding)
    m = case["mutation"]
    if "cut" in m:
        data = data[: max(0, len(data) - m["cut"])]
    elif "flip" in m and data:
        i = m["flip"] % len(data)
        data = data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1 :]
    elif "pad" in m:
        data += bytes.fromhex(m["pad"])
    if case["header"] is not None:
        return data, [case["header"]] if case["header"] else []
    names = ["deflate" if c == "deflate-raw" else c for c in reversed(case["codings"])]
    return data, [", ".join(names)] if names else []


def serve_case(case: dict[str, Any]) -> Loopback:
    body, codings = build(case)

    def handle(ex: Exchange) -> None:
        robots = ex.path == "/robots.txt"
        if robots != case["as_robots"]:
            ex.send(404 if robots else 200, PAGE.format("fine").encode(), "text/plain")
            return
        send_encoded(ex, body, "text/plain" if robots else HTML, codings)

    return Loopback(handle).start()


@pytest_asyncio.fixture
async def scrape(client: Client, tmp_path: Path) -> AsyncIterator[tuple[Stack, BodyMeter]]:
    settings, tools, meter = metered_scrape(tmp_path, LIMITS)
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            yield stack, meter
    finally:
        await tools["fetch_url"].aclose()


def scrape_input(server: Loopback) -> dict[str, Any]:
    return {"url": server.url("/page"), "extraction_spec": {"fields": {"h1": "h1"}}}


@pytest.mark.timeout(240)
async def test_fuzzed_bodies_through_pipelines(scrape: tuple[Stack, BodyMeter]) -> None:
    stack, meter = scrape
    cases = generate(bodies)
    servers = [serve_case(c) for c in cases]
    try:
        outcomes = await asyncio.gather(
            *(
                outcome(
                    stack,
                    {
                        "name": "fuzz-bodies",
                        "tenant": "acme",
                        "steps": [
                            {"id": "s", "worker": "web-scrape", "input": scrape_input(server)}
                        ],
                    },
                )
                for server in servers
            )
        )
    finally:
        for server in servers:
            server.stop()
    problems, codes = [], set()
    for case, (status, result, task_failures) in zip(cases, outcomes, strict=True):
        step = result.steps.get("s") if result is not None else None
        code = step.error_code if step is not None else None
        codes.add(code or (step.status if step is not None else status))
        ok = task_failures == 0 and step is not None
        ok = ok and (step.status in ("succeeded", "partial") or code in STABLE)  # type: ignore[union-attr]
        if not ok:
            problems.append(f"{status} / {code}, {task_failures} task failures: {show(case)}")
    assert not problems, "\n".join(problems)
    assert meter.reads and meter.largest_overshoot <= CHUNK
    # The generator must reach success, the cap and the refusals, or it proves little.
    assert {"payload_too_large", "fetch_failed"} <= codes and codes & {"succeeded", "partial"}


@pytest.mark.timeout(240)
async def test_fuzzed_bodies_through_the_worker_runtime(tmp_path: Path) -> None:
    settings, tools, meter = metered_scrape(tmp_path, LIMITS)
    runtime = WorkerRuntime(settings, load_specs(), tools=tools)
    cases = generate(bodies, 150)
    problems, codes = [], set()
    try:
        for i, case in enumerate(cases):
            server = serve_case(case)
            try:
                before = meter.largest_overshoot
                request = {
                    "worker_id": "web-scrape",
                    "idempotency_key": f"fuzz/{i}",
                    "input": scrape_input(server),
                    "constraints": {"timeout_seconds": 10},
                }
                try:
                    response = await runtime.run(WebScrape(), request)
                    code = response.status
                except ApplicationError as e:
                    code = e.type or ""
            finally:
                server.stop()
            codes.add(code)
            if code not in STABLE | {"succeeded", "partial"}:
                problems.append(f"{code}: {show(case)}")
            if meter.largest_overshoot > max(before, CHUNK):
                problems.append(f"decoded {meter.largest_overshoot} past the cap: {show(case)}")
    finally:
        await tools["fetch_url"].aclose()
    assert not problems, "\n".join(problems)
    assert meter.largest_overshoot <= CHUNK
    assert {"payload_too_large", "fetch_failed"} <= codes and codes & {"succeeded", "partial"}
