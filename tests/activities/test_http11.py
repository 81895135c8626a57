"""The fetch tool's HTTP/1.1 transport against loopback servers that misbehave on purpose.

Each server here is a real asyncio server on 127.0.0.1 that writes the bytes a
test chooses: keep-alive, closes, extra bytes after a response, a head that
never ends, silence, and TLS with a certificate made for the test.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from aiworker.activities.errors import EgressDeniedError
from aiworker.activities.tools.egress import EgressPolicy
from aiworker.activities.tools.http11 import MAX_HEAD_BYTES, H11Transport

LOOPBACK = EgressPolicy(allow_private_networks=True)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


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


async def read_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while True:
        head = await read_head(reader)
        path = head.split(b" ", 2)[1]
        writer.write(ok(b"conn %d path %s" % (n, path)))
        await writer.drain()


async def get(client: httpx.AsyncClient, url: str) -> str:
    r = await client.get(url)
    return r.text


@asynccontextmanager
async def client_for(transport: H11Transport) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=transport, timeout=5) as client:
        yield client


async def test_one_connection_serves_one_request_after_another() -> None:
    async with serving(keep_alive) as site, client_for(H11Transport(LOOPBACK)) as client:
        texts = [await get(client, site.url(f"/{i}")) for i in range(5)]
    assert texts == [f"conn 1 path /{i}" for i in range(5)]
    assert site.connections == 1


async def test_concurrent_requests_open_connections_up_to_the_limit() -> None:
    release = asyncio.Event()
    in_flight: list[int] = []

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_head(reader)
            in_flight.append(n)
            await release.wait()
            writer.write(ok(b"x"))
            await writer.drain()

    transport = H11Transport(LOOPBACK, max_connections=2)
    async with serving(slow) as site, client_for(transport) as client:
        tasks = [asyncio.create_task(client.get(site.url())) for _ in range(3)]
        for _ in range(500):  # bounded: two requests reach the server within ms
            if len(in_flight) == 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert sorted(in_flight) == [1, 2]  # the third waits for a connection
        # a request with no time to wait for one gets httpx's pool timeout
        with pytest.raises(httpx.PoolTimeout):
            await client.get(site.url(), timeout=httpx.Timeout(5, pool=0.05))
        release.set()
        done = await asyncio.gather(*tasks)
    assert [r.status_code for r in done] == [200, 200, 200]
    assert site.connections == 2  # the third ran on a connection the first two freed


async def test_a_connection_the_server_closed_is_not_reused() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_head(reader)
        writer.write(ok(b"conn %d" % n))  # keep-alive by HTTP/1.1's default, then a close
        await writer.drain()

    async with serving(once) as site, client_for(H11Transport(LOOPBACK)) as client:
        assert await get(client, site.url()) == "conn 1"
        await asyncio.sleep(0.05)  # the close reaches the client
        assert await get(client, site.url()) == "conn 2"
        # back to back, the close may still be on its way as the next GET goes
        # out on the kept-alive connection: that GET is sent again on a new one
        texts = [await get(client, site.url()) for _ in range(20)]
    assert texts == [f"conn {n}" for n in range(3, 23)]
    assert site.connections == 22


async def answer_then_read_the_next(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
) -> None:
    """Answer one request, then read the head of the next on the kept-alive connection."""
    await read_head(reader)
    writer.write(ok(b"conn %d" % n))
    await writer.drain()
    await read_head(reader)


async def test_a_get_the_server_reset_on_a_kept_alive_connection_goes_once_more() -> None:
    async def then_reset(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await answer_then_read_the_next(reader, writer, n)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # a reset, not a close: the client reads ECONNRESET

    async with serving(then_reset) as site, client_for(H11Transport(LOOPBACK)) as client:
        assert await get(client, site.url()) == "conn 1"
        assert await get(client, site.url()) == "conn 2"
    assert site.connections == 2


async def test_a_post_is_never_sent_twice() -> None:
    bodies: list[bytes] = []

    async def then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await answer_then_read_the_next(reader, writer, n)  # the next: the POST
        bodies.append(await reader.readexactly(2))
        # closes without answering, as a server that dropped it at its idle timeout

    async with serving(then_close) as site, client_for(H11Transport(LOOPBACK)) as client:
        assert await get(client, site.url()) == "conn 1"
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await client.post(site.url(), content=b"{}")
    assert bodies == [b"{}"] and site.connections == 1  # not sent again on a new one


async def test_bytes_past_a_response_never_answer_the_next_request() -> None:
    # A server that sends more than its Content-Length: reusing the connection
    # would read those bytes as the next response (a desync).
    async def extra(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_head(reader)
            writer.write(ok(b"conn %d" % n) + ok(b"smuggled"))
            await writer.drain()

    async with serving(extra) as site, client_for(H11Transport(LOOPBACK)) as client:
        texts = [await get(client, site.url()) for _ in range(3)]
    assert texts == ["conn 1", "conn 2", "conn 3"]


async def test_a_response_left_unread_closes_its_connection() -> None:
    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_head(reader)
            writer.write(ok(b"%d" % n + b"." * 1_000_000))
            await writer.drain()

    async with serving(big) as site, client_for(H11Transport(LOOPBACK)) as client:
        async with client.stream("GET", site.url()) as r:
            first = await r.aiter_raw().__anext__()
            assert first.startswith(b"1")
        r2 = await client.get(site.url())  # a new connection, a whole body
    assert r2.content == b"2" + b"." * 1_000_000
    assert site.connections == 2


async def test_chunked_and_close_delimited_bodies() -> None:
    async def framed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head = await read_head(reader)
        if b"/chunked" in head:
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
        else:
            writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the close")
            await writer.drain()
            writer.close()

    async with serving(framed) as site, client_for(H11Transport(LOOPBACK)) as client:
        assert await get(client, site.url("/chunked")) == "hello world"
        assert await get(client, site.url("/close")) == "until the close"


@pytest.mark.parametrize(
    ("reply", "error", "message"),
    [
        (b"", httpx.RemoteProtocolError, "Server disconnected without sending a response."),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            httpx.RemoteProtocolError,
            "peer closed",
        ),
        (b"HTTP/1.1 999999 what\r\n\r\n", httpx.RemoteProtocolError, "status"),
        (b"NOT HTTP AT ALL\r\n\r\n", httpx.RemoteProtocolError, "illegal status line"),
    ],
    ids=["closed-before-answer", "cut-short", "bad-status", "not-http"],
)
async def test_broken_replies_are_protocol_errors(
    reply: bytes, error: type[Exception], message: str
) -> None:
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_head(reader)
        writer.write(reply)
        await writer.drain()

    async with serving(broken) as site, client_for(H11Transport(LOOPBACK)) as client:
        with pytest.raises(error, match=message):
            r = await client.get(site.url())
            await r.aread()


async def test_a_head_past_the_limit_is_refused_while_it_arrives() -> None:
    sent = 0

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        nonlocal sent
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(200):  # bounded: 200 x 4 KiB, twice the limit
            writer.write(b"X-Filler: " + b"a" * 4086 + b"\r\n")
            sent += 4098
            await writer.drain()

    async with serving(endless) as site, client_for(H11Transport(LOOPBACK)) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(site.url())
    assert MAX_HEAD_BYTES < sent


async def test_silence_is_a_read_timeout_and_a_closed_port_a_connect_error() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_head(reader)
        await reader.read()  # nothing sent; ends when the client gives up and closes

    transport = H11Transport(LOOPBACK)
    async with serving(silent) as site, client_for(transport) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(site.url(), timeout=httpx.Timeout(5, read=0.1))
        port = site.port
    async with client_for(H11Transport(LOOPBACK)) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/")


async def test_every_address_is_vetted_before_a_connection_opens() -> None:
    async with serving(keep_alive) as site:
        async with client_for(H11Transport(EgressPolicy())) as client:
            with pytest.raises(EgressDeniedError, match="loopback"):
                await client.get(site.url())
            # a name that resolves to loopback is vetted after resolution
            with pytest.raises(EgressDeniedError, match="loopback"):
                await client.get(f"http://localhost:{site.port}/")
    assert site.connections == 0


async def test_a_request_body_is_sent_whole() -> None:
    got: list[bytes] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head = await read_head(reader)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        got.append(await reader.readexactly(length))
        writer.write(ok(b"thanks"))
        await writer.drain()

    body = b"{" + b'"k": "v", ' * 200_000 + b"}"  # larger than a socket buffer
    async with serving(echo) as site, client_for(H11Transport(LOOPBACK)) as client:
        r = await client.post(site.url(), content=body)
    assert r.text == "thanks" and got == [body]


async def test_a_header_value_with_a_newline_is_refused_before_sending() -> None:
    async with serving(keep_alive) as site, client_for(H11Transport(LOOPBACK)) as client:
        with pytest.raises(httpx.LocalProtocolError):
            await client.get(site.url(), headers={"X-Bad": "a\r\nInjected: 1"})


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
        async with client_for(H11Transport(LOOPBACK, ssl_context=trusting)) as client:
            texts = [await get(client, url) for _ in range(2)]
        assert texts == ["conn 1 path /secure"] * 2
        # the default context does not trust a certificate it has never seen
        async with client_for(H11Transport(LOOPBACK)) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(url)
