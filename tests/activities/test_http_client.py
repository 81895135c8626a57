"""The fetch tool's and the webhook poster's HTTP client (aiohttp) against loopback
servers that misbehave on purpose.

Each server here is a real asyncio server on 127.0.0.1 that writes the bytes a
test chooses: keep-alive, resets and closes, broken status lines, a head that
never ends, floods of ``102 Processing`` heads, silence, and TLS with a
certificate made for the test. The client is driven through the tools that use
it (``FetchTool``, ``WebhookPoster``), so each case ends with its stable code.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from support.waiting import wait_until

from aiworker.activities.errors import (
    EgressDeniedError,
    FetchFailedError,
    FetchTimeoutError,
    InvalidInputError,
)
from aiworker.activities.publish import REPLY_MAX_BYTES, WebhookPoster
from aiworker.activities.tools import scrape_tools
from aiworker.activities.tools.egress import EgressPolicy
from aiworker.activities.tools.fetch import FetchLimits, FetchTool
from aiworker.activities.tools.http_client import (
    MAX_HEAD_BYTES,
    MAX_INTERIM,
    client_session,
)
from aiworker.activities.tools.shares import tenant_share
from aiworker.config.settings import Settings, SettingsError
from aiworker.schemas.errors import ErrorCode

LOOPBACK = EgressPolicy(allow_private_networks=True)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
# asyncio reads at most this much from a socket at once (selector transports):
# what a bound can be overshot by, received but never parsed.
RECV = 256 * 1024


class Server:
    """An asyncio server on loopback; counts the connections it accepted."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def url(self, path: str = "/", scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"


@asynccontextmanager
async def serving(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    server = Server(handler)
    listener = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=tls)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
        await listener.wait_closed()


@asynccontextmanager
async def fetcher(policy: EgressPolicy = LOOPBACK, **limits: float) -> AsyncIterator[FetchTool]:
    tool = FetchTool(policy, limits=FetchLimits(**limits))  # type: ignore[arg-type]
    try:
        yield tool
    finally:
        await tool.aclose()


@asynccontextmanager
async def poster() -> AsyncIterator[WebhookPoster]:
    tool = WebhookPoster(Settings(allow_private_networks=True))
    try:
        yield tool
    finally:
        await tool.aclose()


async def read_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while True:
        head = await read_head(reader)
        path = head.split(b" ", 2)[1]
        length = 0
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        writer.write(ok(b"conn %d path %s" % (n, path)))
        await writer.drain()


async def get(tool: FetchTool, url: str) -> str:
    return (await tool.fetch(url, timeout=10, respect_robots=False)).text


# --- connections ------------------------------------------------------------------------------


async def test_one_connection_serves_one_request_after_another() -> None:
    async with serving(keep_alive) as site, fetcher() as tool:
        texts = [await get(tool, site.url(f"/{i}")) for i in range(5)]
        async with poster() as hooks:
            replies = [await hooks.post(site.url("/hook"), {"n": i}, {}, 10) for i in range(3)]
    assert texts == [f"conn 1 path /{i}" for i in range(5)]
    assert [r.status for r in replies] == [200, 200, 200]
    assert site.connections == 2  # one for the fetches, one for the webhook's posts


async def answer_then_read_the_next(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
) -> None:
    """Answer one request, then read the head of the next on the kept-alive connection."""
    await read_head(reader)
    writer.write(ok(b"conn %d" % n))
    await writer.drain()
    await read_head(reader)


@pytest.mark.parametrize("how", ["reset", "close"])
async def test_a_get_the_server_dropped_on_a_kept_alive_connection_goes_once_more(
    how: str,
) -> None:
    async def then_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await answer_then_read_the_next(reader, writer, n)
        if how == "reset":  # the client reads ECONNRESET
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        # else: closed without an answer, as a server at its idle timeout

    async with serving(then_drop) as site, fetcher() as tool:
        assert await get(tool, site.url()) == "conn 1"
        assert await get(tool, site.url()) == "conn 2"
    assert site.connections == 2


async def test_a_post_is_never_sent_twice() -> None:
    bodies: list[bytes] = []

    async def then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await answer_then_read_the_next(reader, writer, n)  # the next: the POST
        bodies.append(await reader.readexactly(7))
        # closes without answering, as a server that dropped it at its idle timeout

    async with serving(then_close) as site, poster() as hooks:
        assert (await hooks.post(site.url(), {"n": 1}, {}, 10)).status == 200
        bodies.clear()
        with pytest.raises(FetchFailedError, match="disconnected"):
            await hooks.post(site.url(), {"n": 2}, {}, 10)
    assert bodies == [b'{"n":2}'] and site.connections == 1  # not sent again on a new one


async def test_a_response_left_unread_closes_its_connection() -> None:
    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_head(reader)
            writer.write(ok(b"%d" % n + b"." * 1_000_000))
            await writer.drain()

    async with serving(big) as site, fetcher() as tool:
        deadline = asyncio.get_running_loop().time() + 10
        async with tool.stream(site.url(), deadline=deadline, respect_robots=False) as (resp, _):
            first = await resp.content.readany()
            assert first.startswith(b"1")
        page = await tool.fetch(site.url(), timeout=10, respect_robots=False)
    assert page.body == b"2" + b"." * 1_000_000  # a new connection, a whole body
    assert site.connections == 2


async def test_bytes_past_a_response_never_answer_the_next_request() -> None:
    # A server that sends more than its Content-Length: reusing the connection
    # would read those bytes as the next response (a desync).
    async def extra(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_head(reader)
            writer.write(ok(b"conn %d" % n) + ok(b"smuggled"))
            await writer.drain()

    async with serving(extra) as site, fetcher() as tool:
        texts = [await get(tool, site.url()) for _ in range(3)]
    assert texts == ["conn 1", "conn 2", "conn 3"]


# --- broken replies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "meaning"),
    [
        (b"", "disconnected"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 10\r\n\r\nshort", "body"),
        (b"HTTP/1.1 999999 what\r\n\r\n", "not a valid HTTP response"),
        (b"NOT HTTP AT ALL\r\n\r\n", "not a valid HTTP response"),
    ],
    ids=["closed-before-answer", "cut-short", "bad-status", "not-http"],
)
async def test_broken_replies_are_fetch_failed(reply: bytes, meaning: str) -> None:
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_head(reader)
        writer.write(reply)
        await writer.drain()

    async with serving(broken) as site, fetcher() as tool:
        with pytest.raises(FetchFailedError, match=meaning) as e:
            await get(tool, site.url())
    assert e.value.code == ErrorCode.FETCH_FAILED


async def test_a_head_past_the_limit_is_refused_while_it_arrives() -> None:
    sent = 0

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        nonlocal sent
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(2_000):  # bounded: 2,000 x 4 KiB, 80 times the limit
            if writer.is_closing():  # the client hung up
                return
            writer.write(b"X-Filler: " + b"a" * 4086 + b"\r\n")
            sent += 4098
            await writer.drain()

    async with serving(endless) as site, fetcher() as tool:
        with pytest.raises(FetchFailedError, match="response heads refused") as e:
            await get(tool, site.url())
    ctx = e.value.context
    assert ctx["reason"] == "response_head" and ctx["limit_bytes"] == MAX_HEAD_BYTES
    assert MAX_HEAD_BYTES < ctx["received_bytes"] <= MAX_HEAD_BYTES + RECV
    assert sent < 2_000 * 4098  # the client hung up long before the server was done


# --- interim (1xx) responses --------------------------------------------------------------------

FLOOD = 200_000  # heads a flooding server sends at most (bounded)


def flood(pad: int, stats: dict[str, int], body_first: bool = False) -> Handler:
    """A server answering each request with up to FLOOD ``102 Processing`` heads (each
    with ``pad`` bytes of header), then 200; ``stats["sent"]`` counts the bytes written."""
    head = b"HTTP/1.1 102 Processing\r\n" + (b"X-Pad: " + b"p" * pad + b"\r\n" if pad else b"")
    head += b"\r\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_head(reader)
        if body_first:
            await reader.readexactly(7)
        for _ in range(FLOOD // 100):
            if writer.is_closing():  # the client hung up
                return
            writer.write(head * 100)
            stats["sent"] += len(head) * 100
            await writer.drain()
        writer.write(ok(b"<h1>finally</h1>"))
        await writer.drain()

    return handler


@pytest.mark.parametrize(
    ("pad", "bound"),
    [(0, "count"), (4000, "bytes")],
    ids=["many-small-heads", "large-heads"],
)
async def test_a_102_flood_on_a_fetch_is_cut_off_at_the_head_bounds(pad: int, bound: str) -> None:
    stats = {"sent": 0}
    async with serving(flood(pad, stats)) as site, fetcher() as tool:
        with pytest.raises(FetchFailedError, match="response heads refused") as e:
            await get(tool, site.url())
    ctx = e.value.context
    assert e.value.code == ErrorCode.FETCH_FAILED and ctx["reason"] == "response_head"
    assert ctx["received_bytes"] <= MAX_HEAD_BYTES + RECV
    if bound == "count":  # small heads: the count binds long before the bytes (the
        # heads of the read that passed it were parsed whole: one read of 28-byte heads)
        assert MAX_INTERIM < ctx["interim"] <= MAX_HEAD_BYTES // 28
    else:  # 4 KiB heads: the bytes bind before the count
        assert ctx["interim"] <= MAX_HEAD_BYTES // 4000 < MAX_INTERIM
    assert stats["sent"] < FLOOD * 27  # the flood was cut off, not read to its 200


async def test_a_102_flood_on_a_webhook_reply_is_cut_off_at_the_reply_cap() -> None:
    stats = {"sent": 0}
    async with serving(flood(1000, stats, body_first=True)) as site, poster() as hooks:
        with pytest.raises(FetchFailedError, match="response heads refused") as e:
            await hooks.post(site.url("/hook"), {"n": 1}, {}, 10)
    ctx = e.value.context
    assert ctx["reason"] == "response_head" and ctx["limit_bytes"] == REPLY_MAX_BYTES
    assert REPLY_MAX_BYTES < ctx["received_bytes"] <= REPLY_MAX_BYTES + RECV
    assert ctx["interim"] <= REPLY_MAX_BYTES // 1000
    assert stats["sent"] < FLOOD * 1027


async def test_a_few_interim_responses_are_read_past() -> None:
    async def early_hints(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 102 Processing\r\n\r\n" * 3)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n")
        writer.write(ok(b"<h1>after the hints</h1>"))
        await writer.drain()

    async with serving(early_hints) as site, fetcher() as tool:
        assert await get(tool, site.url()) == "<h1>after the hints</h1>"


# --- time -----------------------------------------------------------------------------------


async def test_silence_is_fetch_timeout_and_a_closed_port_fetch_failed() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_head(reader)
        await reader.read()  # nothing sent; ends when the client gives up and closes

    async with serving(silent) as site, fetcher(read_timeout=0.2) as tool:
        with pytest.raises(FetchTimeoutError):
            await get(tool, site.url())
        port = site.port
    async with fetcher() as tool:
        with pytest.raises(FetchFailedError, match="cannot connect"):
            await get(tool, f"http://127.0.0.1:{port}/")


# --- what is refused before a byte goes out ---------------------------------------------------


async def test_every_address_is_vetted_before_a_connection_opens() -> None:
    async with serving(keep_alive) as site:
        # the session itself, below the fetch tool's URL check: the connect-time checks
        session = client_session(EgressPolicy())
        try:
            with pytest.raises(EgressDeniedError, match="loopback"):  # a literal
                await session.get(site.url())
            # a name that resolves to loopback is vetted after resolution
            with pytest.raises(EgressDeniedError, match="loopback"):
                await session.get(f"http://localhost:{site.port}/")
        finally:
            await session.close()
        async with fetcher(EgressPolicy()) as tool:
            with pytest.raises(EgressDeniedError):
                await get(tool, f"http://localhost:{site.port}/")
    assert site.connections == 0


async def test_a_header_value_with_a_newline_is_refused_before_sending() -> None:
    heads: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        heads.append(await reader.read())

    async with serving(record) as site:
        async with poster() as hooks:
            with pytest.raises(InvalidInputError, match="not valid HTTP"):
                await hooks.post(site.url(), {"n": 1}, {"X-Bad": "a\r\nInjected: 1"}, 10)
        async with fetcher() as tool:
            with pytest.raises(InvalidInputError, match="user_agent"):
                await tool.fetch(site.url(), timeout=10, user_agent="a\r\nInjected: 1")
        for _ in range(200):  # bounded: the closed connection reaches the server
            if len(heads) == site.connections:
                break
            await asyncio.sleep(0.01)
    assert not any(heads)  # the server never saw a byte of either request


# --- TLS ----------------------------------------------------------------------------------------


def _certificate(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (and its key), made for the test."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aiworker test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_https_verifies_the_server_and_keeps_the_connection(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))
    async with serving(keep_alive, tls=server_tls) as site:
        url = site.url("/secure", scheme="https")
        session = client_session(LOOPBACK, ssl_context=trusting)
        try:
            texts = []
            for _ in range(2):
                async with session.get(url) as r:
                    texts.append(await r.text())
        finally:
            await session.close()
        assert texts == ["conn 1 path /secure"] * 2
        # the default context does not trust a certificate it has never seen
        async with fetcher() as tool:
            with pytest.raises(FetchFailedError, match="CERTIFICATE_VERIFY_FAILED"):
                await get(tool, url)


async def test_bytes_sent_to_an_idle_connection_never_answer_the_next_request() -> None:
    answered = asyncio.Event()

    async def idle_talker(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await read_head(reader)
        writer.write(ok(b"conn %d" % n))
        await writer.drain()
        await answered.wait()  # the client has its response: the connection is idle
        writer.write(ok(b"smuggled"))
        await writer.drain()
        await read_head(reader)
        writer.write(ok(b"conn %d again" % n))
        await writer.drain()
        await reader.read()

    async with serving(idle_talker) as site, fetcher() as tool:
        assert await get(tool, site.url()) == "conn 1"
        answered.set()
        for _ in range(100):  # bounded: the unasked-for bytes reach the client
            await asyncio.sleep(0.01)
        assert await get(tool, site.url()) == "conn 2"


# --- the pool across tenants ------------------------------------------------------------------


class Tarpit:
    """A handler that never answers: it holds each connection until the client closes it,
    counting those open."""

    def __init__(self) -> None:
        self.open = 0

    async def __call__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        self.open += 1
        try:
            await reader.read()  # until the client closes its end
        finally:
            self.open -= 1


def tarpit_names(port: int) -> EgressPolicy:
    """Loopback allowed, and every ``*.tarpit.test`` name resolving to 127.0.0.1: one
    origin per name, so neither the per-host limit nor politeness binds."""

    async def resolve(host: str, _port: int) -> list[str]:
        if host.endswith(".tarpit.test"):
            return ["127.0.0.1"]
        raise OSError(f"no such host in this test: {host}")

    return EgressPolicy(allow_private_networks=True, resolver=resolve)


async def steady(count: Callable[[], int], at_least: int) -> int:
    """Wait until ``count()`` is at least ``at_least`` and has not changed over five
    polls (bounded); return it."""
    seen: list[int] = []

    def settled() -> bool:
        seen.append(count())
        last = seen[-5:]
        return len(last) == 5 and last[0] >= at_least and len(set(last)) == 1

    await wait_until(settled, lambda: f"a steady count (last: {seen[-5:]})", interval=0.2)
    return seen[-1]


async def test_one_tenant_holds_only_its_share_and_another_tenants_fetch_goes_through() -> None:
    """acme sends 120 fetches at a server that never answers; with the default pool (100)
    it holds its share (half), and globex's fetch of another site gets a connection and
    succeeds while acme's are still held. Before: acme held all 100 and globex's fetch
    waited for one until its deadline (``fetch_timeout``)."""
    pit = Tarpit()
    async with serving(pit) as hold, serving(keep_alive) as site:
        tool = FetchTool(tarpit_names(hold.port))
        held: list[asyncio.Task[object]] = []
        try:
            with tenant_share("acme"):
                held = [
                    asyncio.create_task(
                        tool.fetch(
                            f"http://h{i}.tarpit.test:{hold.port}/",
                            timeout=120,
                            respect_robots=False,
                        )
                    )
                    for i in range(120)
                ]
            share = tool.shares.per_tenant
            assert await steady(lambda: pit.open, share) == share == 50
            with tenant_share("globex"):
                # far above a loopback fetch: a wait for the pool would end it first
                page = await tool.fetch(site.url("/"), timeout=15, respect_robots=False)
            assert page.text == "conn 1 path /"
            assert pit.open == share and not any(t.done() for t in held)
        finally:
            for t in held:
                t.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            await tool.aclose()


async def test_a_fetch_that_gets_no_share_in_time_is_fetch_timeout_naming_its_tenant() -> None:
    """A pool of 4, a share of 2: acme's third fetch waits for its own tenant's
    connections only, within its own deadline, and then fails ``fetch_timeout``
    (``reason: tenant_share``), through ``fetch`` (under its own timeout) and
    ``stream`` (a deadline); globex's fetch meanwhile gets one of the other two."""
    pit = Tarpit()
    async with serving(pit) as hold, serving(keep_alive) as site:
        tool = FetchTool(tarpit_names(hold.port), max_connections=4, tenant_share=0.5)
        held: list[asyncio.Task[object]] = []
        try:
            with tenant_share("acme"):
                held = [
                    asyncio.create_task(
                        tool.fetch(
                            f"http://h{i}.tarpit.test:{hold.port}/",
                            timeout=120,
                            respect_robots=False,
                        )
                    )
                    for i in range(2)
                ]
                assert await steady(lambda: pit.open, 2) == 2
                with pytest.raises(FetchTimeoutError) as by_fetch:
                    await tool.fetch(
                        f"http://late.tarpit.test:{hold.port}/", timeout=0.5, respect_robots=False
                    )
                with pytest.raises(FetchTimeoutError) as by_stream:
                    async with tool.stream(
                        f"http://later.tarpit.test:{hold.port}/",
                        deadline=time.monotonic() + 0.5,
                        respect_robots=False,
                    ):
                        pass
            for e in (by_fetch.value, by_stream.value):
                assert e.code == ErrorCode.FETCH_TIMEOUT and e.retryable
                assert (e.context["reason"], e.context["tenant"]) == ("tenant_share", "acme")
                assert e.context["connections"] == 2
                assert "AIWORKER_FETCH_TENANT_SHARE" in e.message
            assert pit.open == 2  # the late fetches never connected
            with tenant_share("globex"):
                assert await get(tool, site.url("/")) == "conn 1 path /"
        finally:
            for t in held:
                t.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            await tool.aclose()


async def test_the_pool_settings_reach_the_fetch_and_render_tools(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "AIWORKER_DATA_DIR": str(tmp_path),
            "AIWORKER_FETCH_MAX_CONNECTIONS": "8",
            "AIWORKER_FETCH_TENANT_SHARE": "0.25",
            "AIWORKER_BROWSER_MAX_IN_FLIGHT": "3",
        }
    )
    tools = scrape_tools(settings)
    try:
        assert tools["fetch_url"].max_connections == 8
        assert tools["fetch_url"].shares.per_tenant == 2
        assert tools["render"].limits.max_in_flight == 3
    finally:
        await tools["fetch_url"].aclose()
    defaults = Settings()
    assert (defaults.fetch_max_connections, defaults.fetch_tenant_share) == (100, 0.5)
    assert defaults.browser_max_in_flight == 6
    for name, value in (
        ("FETCH_TENANT_SHARE", "0"),
        ("FETCH_TENANT_SHARE", "1.5"),
        ("FETCH_MAX_CONNECTIONS", "0"),
        ("BROWSER_MAX_IN_FLIGHT", "0"),
    ):
        with pytest.raises(SettingsError, match=f"AIWORKER_{name}"):
            Settings.from_env({f"AIWORKER_{name}": value})
