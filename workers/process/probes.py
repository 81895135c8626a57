"""The worker's HTTP side: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``.

``/healthz`` answers while the process is alive; ``/readyz`` only while the
process is connected to Temporal and polling (the worker process flips it).
Runs in a daemon thread so a busy event loop cannot starve the probes.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest


class Health:
    """Readiness as the worker process sees it.

    Ready means both: the workers are polling (:meth:`set`, flipped by the
    worker process) and the last probe of the Temporal frontend answered
    (:meth:`set_connected`, flipped by ``workers.process.worker.watch_connection``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._polling = False
        self._polling_reason = "starting"
        self._connected = True
        self._connection_reason = ""

    def set(self, ready: bool, reason: str) -> None:
        """Whether the workers are polling, and what they poll (or why not)."""
        with self._lock:
            self._polling, self._polling_reason = ready, reason

    def set_connected(self, ok: bool, reason: str = "") -> None:
        """Whether the last probe reached the Temporal frontend."""
        with self._lock:
            self._connected, self._connection_reason = ok, reason

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._polling and self._connected

    @property
    def reason(self) -> str:
        with self._lock:
            if self._polling and not self._connected:
                return self._connection_reason
            return self._polling_reason


class MetricsServer:
    """A small threaded HTTP server for probes and metrics."""

    def __init__(
        self, host: str, port: int, health: Health, registry: CollectorRegistry = REGISTRY
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._send(200, b"ok\n", "text/plain")
                elif path == "/readyz":
                    h = outer.health
                    code = 200 if h.ready else 503
                    self._send(code, (h.reason + "\n").encode(), "text/plain")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (BaseHTTPRequestHandler's signature)
                return  # probes every few seconds would drown the JSON logs

        self.health = health
        self.registry = registry
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
