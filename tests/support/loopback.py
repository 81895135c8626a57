"""A real HTTP upstream on loopback that fails on purpose and counts what reaches it.

Modes:

- ``up``: every request gets 200 with a small HTML page (``<h1>`` names the path);
- ``down``: every request gets 503;
- ``alternate``: per path, the 1st, 3rd, 5th ... request gets 503 and the
  others 200, so exactly half of all requests fail and every caller needs
  exactly two attempts, whatever the interleaving.

The server runs in a thread (``ThreadingHTTPServer`` on port 0) and is
stopped by the test that started it.
"""

from __future__ import annotations

import html
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Upstream:
    """State shared by the handler threads: the mode and the request counts."""

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


def _handler(state: Upstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            status = state.decide(self.path)
            body = f"<html><body><h1>{html.escape(self.path)}</h1></body></html>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def upstream(mode: str = "up") -> Iterator[Upstream]:
    """Run an :class:`Upstream` on ``127.0.0.1:<free port>`` for the block."""
    state = Upstream(mode)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
