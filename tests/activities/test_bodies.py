"""Every body the project reads is bounded (issue 15, item 3).

Compression bombs, stacked and unknown encodings through the web-scrape
worker on a real Temporal server; a webhook that answers an endless body; a
model provider that answers a bomb; a robots.txt that is a bomb. A
:class:`BodyMeter` on each tool counts the bytes the decoders produced:
never more than the cap plus one piece (``CHUNK``), whatever the body.
"""

from __future__ import annotations

import functools
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import brotli
import httpx
import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from prometheus_client import CollectorRegistry
from support.bodies import metered_scrape, send_encoded
from support.loopback import HTML, Exchange, serve
from support.pipelines import pipeline_result
from temporalio.client import Client

from aiworker.activities.bodies import (
    CHUNK,
    BodyMeter,
    BodyTooLargeError,
    CorruptBodyError,
    UnsupportedEncodingError,
    read_body,
)
from aiworker.activities.llm import LanguageModel, LlmMetrics, load_registry
from aiworker.activities.publish import REPLY_MAX_BYTES, Publish, WebhookPoster
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools import FetchLimits
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import PipelineResult

GIB = 1 << 30
PAGE = b"<html><body><h1>fine</h1></body></html>"
H1 = {"fields": {"h1": {"selector": "h1", "required": True}}}
CAP = FetchLimits().max_bytes


def _squeeze(compressor: Any, method: str, finish: str, total: int, block: bytes) -> bytes:
    out = [getattr(compressor, method)(block) for _ in range(total // len(block))]
    return b"".join([*out, getattr(compressor, finish)()])


@functools.cache
def br_bomb(fill: bytes = b"\0", head: bytes = b"") -> bytes:
    """1 GiB of ``fill`` after ``head``, brotli at quality 5 (about 1.6 KB)."""
    c = brotli.Compressor(quality=5)
    return c.process(head) + _squeeze(c, "process", "finish", GIB, fill * (1 << 24))


@functools.cache
def zlib_bomb(wbits: int) -> bytes:
    """256 MiB of zeros as gzip (31), zlib-wrapped (15) or raw (-15) deflate (about 260 KB)."""
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return _squeeze(c, "compress", "flush", 256 << 20, bytes(1 << 20))


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


# path -> (body, its Content-Encoding header lines)
ROUTES: dict[str, tuple[bytes, list[str]]] = {}


def routes() -> dict[str, tuple[bytes, list[str]]]:
    if not ROUTES:
        twice = gzip.compress(gzip.compress(PAGE))
        ROUTES.update(
            {
                "/br-bomb": (br_bomb(), ["br"]),
                "/gzip-bomb": (zlib_bomb(31), ["gzip"]),
                "/deflate-bomb": (zlib_bomb(15), ["deflate"]),
                "/raw-deflate-bomb": (zlib_bomb(-15), ["deflate"]),
                "/stacked": (twice, ["gzip, gzip"]),
                "/stacked-lines": (twice, ["gzip", "gzip"]),
                "/zstd": (PAGE, ["zstd"]),
                "/truncated": (gzip.compress(PAGE * 50)[:-20], ["gzip"]),
                "/raw-deflate": (raw_deflate(PAGE), ["deflate"]),
                "/identity-gzip": (gzip.compress(PAGE), ["identity, gzip"]),
                "/x-gzip": (gzip.compress(PAGE), ["X-GZIP"]),
            }
        )
    return ROUTES


def handle(ex: Exchange) -> None:
    if ex.path == "/robots.txt":
        ex.send(404, b"", "text/plain")
        return
    body, codings = routes()[ex.path]
    send_encoded(ex, body, HTML, codings)


@pytest.fixture(scope="module")
def site() -> Iterator[Any]:
    routes()
    with serve(handle) as server:
        yield server


def step(sid: str, url: str, **extra: Any) -> dict[str, Any]:
    inp = {"url": url, "extraction_spec": H1, **extra.pop("input", {})}
    return {"id": sid, "worker": "web-scrape", "input": inp, "on_failure": "continue", **extra}


@pytest_asyncio.fixture
async def scrape(client: Client, tmp_path: Path) -> AsyncIterator[tuple[Stack, BodyMeter]]:
    settings, tools, meter = metered_scrape(tmp_path)
    try:
        async with running_stack(client, settings, tools=tools) as stack:
            yield stack, meter
    finally:
        await tools["fetch_url"].aclose()


async def run(stack: Stack, steps: list[dict[str, Any]]) -> PipelineResult:
    handle = await stack.start({"name": "bodies", "tenant": "acme", "steps": steps})
    result: PipelineResult = await pipeline_result(handle)
    return result


async def test_bombs_and_refused_encodings_through_the_web_scrape_worker(
    scrape: tuple[Stack, BodyMeter], site: Any
) -> None:
    stack, meter = scrape
    paths = [p.lstrip("/") for p in routes()]
    result = await run(stack, [step(p, site.url("/" + p)) for p in paths])
    codes = {k: (v.error_code or v.status, v.attempts) for k, v in result.steps.items()}
    assert codes == {
        "br-bomb": ("payload_too_large", 1),
        "gzip-bomb": ("payload_too_large", 1),
        "deflate-bomb": ("payload_too_large", 1),
        "raw-deflate-bomb": ("payload_too_large", 1),
        "stacked": ("payload_too_large", 1),
        "stacked-lines": ("payload_too_large", 1),
        "zstd": ("payload_too_large", 1),
        "truncated": ("fetch_failed", 2),
        "raw-deflate": ("succeeded", 1),
        "identity-gzip": ("succeeded", 1),
        "x-gzip": ("succeeded", 1),
    }
    s = result.steps
    assert "stacked Content-Encoding" in (s["stacked"].error_message or "")
    assert "'zstd'" in (s["zstd"].error_message or "")
    assert f"{CAP}-byte limit" in (s["br-bomb"].error_message or "")
    for ok in ("raw-deflate", "identity-gzip", "x-gzip"):
        assert s[ok].outputs["data"]["h1"] == "fine"
    # Each bomb was decoded up to the cap and not one piece further.
    assert CAP < meter.largest_read <= CAP + CHUNK
    assert 0 < meter.largest_overshoot <= CHUNK
    # 4 bombs of 1 GiB / 256 MiB each, all received in full (they are small on the wire)
    # and the rest: far under what decoding them in full would have produced.
    assert meter.raw_bytes < 2 << 20
    assert meter.decoded_bytes <= 4 * (CAP + CHUNK) + (1 << 20)


async def test_a_robots_txt_bomb_is_read_to_its_cap_and_its_rules_kept(
    scrape: tuple[Stack, BodyMeter],
) -> None:
    rules = b"User-agent: *\nDisallow: /blocked\n"
    bomb = br_bomb(b"\n", rules)

    def robots_bomb(ex: Exchange) -> None:
        if ex.path == "/robots.txt":
            ex.send(200, bomb, "text/plain", {"Content-Encoding": "br"})
        else:
            ex.send(200, PAGE)

    stack, meter = scrape
    with serve(robots_bomb) as bombing:
        result = await run(
            stack, [step("page", bombing.url("/page")), step("blocked", bombing.url("/blocked"))]
        )
    codes = {k: (v.error_code or v.status, v.attempts) for k, v in result.steps.items()}
    assert codes == {"page": ("succeeded", 1), "blocked": ("access_denied", 1)}
    cap = FetchLimits().robots_max_bytes
    assert cap < meter.largest_read <= cap + CHUNK
    assert meter.largest_overshoot <= CHUNK


async def test_a_webhook_reply_is_drained_to_a_small_cap(settings: Settings) -> None:
    """A webhook that answers an endless body: the record is published, the reply cut off."""
    sent = {"bytes": 0}

    def endless(ex: Exchange) -> None:
        ex.body()

        def pieces() -> Iterator[bytes]:
            for _ in range(GIB // CHUNK):  # bounded: stops at 1 GiB if nobody hangs up
                if ex.stopping.is_set():
                    return
                sent["bytes"] += CHUNK
                yield b"x" * CHUNK

        ex.stream(200, pieces(), "application/json")

    meter = BodyMeter()
    poster = WebhookPoster(settings, meter=meter)
    runtime = WorkerRuntime(settings, load_specs(), tools={"http_post": poster})
    with serve(endless) as hook:
        response = await runtime.run(
            Publish(),
            {
                "worker_id": "publish",
                "idempotency_key": "wf/endless",
                "tenant": "acme",
                "constraints": {"timeout_seconds": 20},
                "input": {"sink": {"webhook": hook.url("/hook")}, "record": {"a": 1}},
            },
        )
    await poster.aclose()
    assert response.status == "succeeded" and response.outputs["published"] is True
    assert meter.reads == 1
    assert REPLY_MAX_BYTES < meter.largest_read <= REPLY_MAX_BYTES + CHUNK
    assert sent["bytes"] < GIB


async def test_a_model_provider_bomb_is_upstream_error_at_the_cap(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    def provider(ex: Exchange) -> None:
        ex.body()
        ex.send(200, br_bomb(), "application/json", {"Content-Encoding": "br"})

    meter = BodyMeter()
    with serve(provider) as llm:
        models = tmp_path / "models.json"
        models.write_text(
            json.dumps(
                {
                    "models": {
                        "bomb": {"provider": "openai", "base_url": llm.url("/v1"), "model": "m"}
                    }
                }
            )
        )
        registry = load_registry(settings.model_copy(update={"models_file": models}), {})
        lm = LanguageModel(registry, metrics=LlmMetrics(CollectorRegistry()), meter=meter)
        try:
            async with running_stack(client, settings, tools={"language_model": lm}) as stack:
                handle = await stack.start(
                    {
                        "name": "llm-bomb",
                        "tenant": "acme",
                        "steps": [
                            {
                                "id": "ask",
                                "worker": "llm-call",
                                "input": {"model": "bomb", "prompt": "hi"},
                                "retry": {"max_attempts": 1},
                            }
                        ],
                        "output": {},
                    }
                )
                result: PipelineResult = await pipeline_result(handle)
        finally:
            await lm.aclose()
    ask = result.steps["ask"]
    assert (ask.error_code, ask.attempts) == ("upstream_error", 1)
    assert f"over {lm.max_reply_bytes} bytes" in (ask.error_message or "")
    assert lm.max_reply_bytes < meter.largest_read <= lm.max_reply_bytes + CHUNK


# --- the reader itself, every coding and cut -------------------------------------------------


def _response(body: bytes, coding: str | None, piece: int) -> httpx.Response:
    class Pieces(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for i in range(0, len(body), piece):
                yield body[i : i + piece]

    headers = {"Content-Encoding": coding} if coding else {}
    return httpx.Response(200, headers=headers, stream=Pieces())


@pytest.mark.parametrize("piece", [1, 7, 65536])
async def test_read_body_decodes_each_coding_in_any_piece_size(piece: int) -> None:
    text = b"".join(b"line %d\n" % i for i in range(3000))
    cases = {
        "gzip": gzip.compress(text),
        "deflate": zlib.compress(text),
        "br": brotli.compress(text),
        None: text,
    }
    for coding, body in cases.items():
        got = await read_body(_response(body, coding, piece), 1 << 20)
        assert got == text, coding
    assert await read_body(_response(raw_deflate(text), "deflate", piece), 1 << 20) == text


REFUSED: dict[str, tuple[Any, str, type[Exception]]] = {
    "br bomb": (br_bomb, "br", BodyTooLargeError),
    "gzip bomb": (lambda: zlib_bomb(31), "gzip", BodyTooLargeError),
    "gzip cut short": (lambda: gzip.compress(PAGE)[:-5], "gzip", CorruptBodyError),
    "br cut short": (lambda: brotli.compress(PAGE * 100)[:-3], "br", CorruptBodyError),
    "not gzip": (lambda: b"\x1f\x8bnot gzip at all", "gzip", CorruptBodyError),
    "not br": (lambda: b"garbage", "br", CorruptBodyError),
    "stacked": (lambda: PAGE, "gzip, br", UnsupportedEncodingError),
    "unknown": (lambda: PAGE, "compress", UnsupportedEncodingError),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_read_body_refuses_what_it_cannot_bound(case: str) -> None:
    make, coding, error = REFUSED[case]
    meter = BodyMeter()
    cap = 1 << 20
    with pytest.raises(error):
        await read_body(_response(make(), coding, 4096), cap, meter=meter)
    assert meter.largest_read <= cap + CHUNK


async def test_read_body_truncates_a_bomb_to_exactly_the_cap() -> None:
    meter = BodyMeter()
    got = await read_body(_response(br_bomb(), "br", 512), 100_000, truncate=True, meter=meter)
    assert got == bytes(100_000)
    assert 100_000 < meter.largest_read <= 100_000 + CHUNK
