"""Real HTTP servers on loopback for tests: the one way a test serves HTTP.

:func:`serve` runs a ``ThreadingHTTPServer`` on ``127.0.0.1:<free port>`` in
a thread for a ``with`` block and hands every request (``GET`` and ``POST``)
to a plain function of an :class:`Exchange`. Stopping is complete: the
``stopping`` event wakes handlers that hold a response on purpose, open
keep-alive connections are shut, and the handler threads are joined, so no
server or thread outlives the block that started it.

An :class:`Exchange` answers well (:meth:`~Exchange.send`,
:meth:`~Exchange.send_json`, :meth:`~Exchange.redirect`) or badly on
purpose: a slow or endless body (:meth:`~Exchange.stream` from a generator
that waits), an error status with ``Retry-After`` (``headers=``), garbage
(any bytes as a body), a connection reset (:meth:`~Exchange.reset`), or a
hang (``exchange.stopping.wait(seconds)``).

:class:`Upstream` and :func:`upstream` are a ready-made upstream that fails on
purpose and counts what reaches it (modes ``up``, ``down``, ``alternate``).
:class:`InFlight` is a slow site that records how many requests per key are in
flight at once (concurrency limits held at a real server).
"""

from __future__ import annotations

import contextlib
import html
import json
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

HTML = "text/html; charset=utf-8"


class Exchange:
    """One request as a handler function sees it, and the ways to answer it.

    Attributes:
        method: ``GET`` or ``POST``.
        target: the request target as sent, query included (``/a?b=1``).
        path: the target without its query.
        query: the parsed query (``parse_qs``).
        headers: the request headers.
        stopping: set when the server stops; a handler that holds a response
            on purpose waits on it so that stopping never waits for the hold.
        raw: the ``BaseHTTPRequestHandler`` itself, for what nothing here covers.
    """

    def __init__(self, raw: BaseHTTPRequestHandler, stopping: threading.Event) -> None:
        self.raw = raw
        self.stopping = stopping
        self.method = raw.command
        self.target = raw.path
        parts = urlsplit(raw.path)
        self.path = parts.path
        self.query = parse_qs(parts.query)
        self.headers = raw.headers
        self._body: bytes | None = None

    def body(self) -> bytes:
        """The request body (read once, by ``Content-Length``)."""
        if self._body is None:
            self._body = self.raw.rfile.read(int(self.headers.get("Content-Length", "0")))
        return self._body

    def json(self) -> Any:
        """The request body as JSON; an empty body reads as ``{}``."""
        return json.loads(self.body() or b"{}")

    def send(
        self,
        status: int,
        body: bytes = b"",
        ctype: str | None = HTML,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer ``status`` with ``body`` (``Content-Length`` set; no
        ``Content-Type`` when ``ctype`` is None). A client that already gave up
        is not an error: there is nobody left to answer."""
        try:
            self.raw.send_response(status)
            if ctype:
                self.raw.send_header("Content-Type", ctype)
            self.raw.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.raw.send_header(k, v)
            self.raw.end_headers()
            self.raw.wfile.write(body)
        except OSError:
            pass

    def send_json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        """Answer ``status`` with ``doc`` as JSON."""
        self.send(status, json.dumps(doc).encode(), "application/json", headers)

    def redirect(self, location: str, status: int = 302) -> None:
        """Answer with a redirect to ``location`` and no body."""
        self.send(status, b"", None, {"Location": location})

    def stream(
        self,
        status: int,
        pieces: Iterable[bytes],
        ctype: str = HTML,
        length: int | None = None,
    ) -> None:
        """Answer with a body written piece by piece as ``pieces`` yields them.

        With ``length`` the response declares that ``Content-Length``, otherwise
        it is chunked. A generator that waits between pieces makes a slow body;
        one that stops early, a short one. A client that stops reading (at its
        own cap) ends the stream quietly.
        """
        try:
            self.raw.send_response(status)
            self.raw.send_header("Content-Type", ctype)
            if length is None:
                self.raw.send_header("Transfer-Encoding", "chunked")
            else:
                self.raw.send_header("Content-Length", str(length))
            self.raw.end_headers()
            for piece in pieces:
                if length is None:
                    piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                self.raw.wfile.write(piece)
            if length is None:
                self.raw.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass

    def reset(self) -> None:
        """Drop the connection with a TCP reset instead of an answer."""
        conn = self.raw.connection
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.raw.close_connection = True
        conn.close()


Handle = Callable[[Exchange], None]


class _Server(ThreadingHTTPServer):
    """Keeps track of its connections and handler threads so that stopping can end them."""

    daemon_threads = True

    def __init__(self, handle: Handle, keep_alive: bool) -> None:
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.connections: set[socket.socket] = set()
        self.threads: set[threading.Thread] = set()
        super().__init__(("127.0.0.1", 0), _handler(handle, self.stopping, keep_alive))

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.threads.add(threading.current_thread())
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.connections.discard(request)
                self.threads.discard(threading.current_thread())

    def close_connections(self) -> list[threading.Thread]:
        """Shut every open connection; the handler threads still running."""
        with self.lock:
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            return list(self.threads)


def _handler(
    handle: Handle, stopping: threading.Event, keep_alive: bool
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0 closes the connection after every response.
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
        # Headers and body go out in separate writes; without this, Nagle plus
        # delayed ACKs add ~40 ms to every keep-alive response.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            handle(Exchange(self, stopping))

        do_POST = do_GET

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (BaseHTTPRequestHandler's signature)
            pass

    return Handler


class Loopback:
    """A running server: where it listens and how to stop it.

    Args:
        handle: called with an :class:`Exchange` for every request, on the
            request's own thread.
        keep_alive: speak HTTP/1.1 and keep connections open between
            requests (as real sites do); False answers as HTTP/1.0, one
            request per connection, for clients a test never closes.
    """

    def __init__(self, handle: Handle, keep_alive: bool = True) -> None:
        self._server = _Server(handle, keep_alive)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """An absolute URL of ``path`` (``"/a?b=1"``) on this server."""
        return self.base_url + path

    def start(self) -> Loopback:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Wake held handlers, stop accepting, shut open connections, join the threads."""
        self._server.stopping.set()
        if self._thread.is_alive():
            self._server.shutdown()
        handlers = self._server.close_connections()
        self._server.server_close()
        self._thread.join(10)
        for t in handlers:
            t.join(10)


@contextlib.contextmanager
def serve(handle: Handle, keep_alive: bool = True) -> Iterator[Loopback]:
    """Serve ``handle`` on ``127.0.0.1:<free port>`` for the block, stopped after it.

    ``keep_alive`` as for :class:`Loopback`.
    """
    server = Loopback(handle, keep_alive).start()
    try:
        yield server
    finally:
        server.stop()


# --- an upstream that fails on purpose ----------------------------------------------------------


class Upstream:
    """State shared by the handler threads: the mode and the request counts.

    - ``up``: every request gets 200 with a small HTML page (``<h1>`` names the path);
    - ``down``: every request gets 503;
    - ``alternate``: per path, the 1st, 3rd, 5th ... request gets 503 and the
      others 200, so exactly half of all requests fail and every caller needs
      exactly two attempts, whatever the interleaving.
    """

    def __init__(self, mode: str = "up") -> None:
        self.mode = mode
        self.lock = threading.Lock()
        self.by_path: Counter[str] = Counter()
        self.by_status: Counter[int] = Counter()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def total(self) -> int:
        with self.lock:
            return sum(self.by_status.values())

    def decide(self, path: str) -> int:
        with self.lock:
            self.by_path[path] += 1
            n = self.by_path[path]
            if self.mode == "down":
                status = 503
            elif self.mode == "alternate":
                status = 503 if n % 2 == 1 else 200
            else:
                status = 200
            self.by_status[status] += 1
            return status

    def handle(self, ex: Exchange) -> None:
        status = self.decide(ex.target)
        ex.send(status, f"<html><body><h1>{html.escape(ex.target)}</h1></body></html>".encode())


@contextlib.contextmanager
def upstream(mode: str = "up") -> Iterator[Upstream]:
    """Run an :class:`Upstream` on ``127.0.0.1:<free port>`` for the block."""
    state = Upstream(mode)
    with serve(state.handle) as server:
        state.port = server.port
        yield state


class InFlight:
    """A slow site (``/slow?k=<key>``, held ``hold`` seconds) that records how many
    requests per key are in flight: ``peak[key]`` is the most at once, ``hits`` all
    that arrived. Anything else (robots.txt) is 404."""

    def __init__(self, hold: float = 0.5) -> None:
        self.hold = hold
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.hits = 0

    def handle(self, ex: Exchange) -> None:
        if not ex.target.startswith("/slow"):
            return ex.send(404, b"", None)
        key = ex.target.split("k=", 1)[1].split("&", 1)[0]
        with self.lock:
            self.hits += 1
            self.running[key] = self.running.get(key, 0) + 1
            self.peak[key] = max(self.peak.get(key, 0), self.running[key])
        try:
            ex.stopping.wait(self.hold)
        finally:
            with self.lock:
                self.running[key] -= 1
        ex.send(200, f"<html><body><h1>{key}</h1></body></html>".encode())
