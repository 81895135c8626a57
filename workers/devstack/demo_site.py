"""The sample shop bundled for the offline demo, served on loopback.

`aiworker demo` starts it on a free port and passes its address to the demo
pipeline as ``inputs.site_url``, so the demo scrapes real HTTP without
reaching the internet.
"""

from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SITE_DIR = Path(__file__).parent.parent / "samples" / "site"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (BaseHTTPRequestHandler's signature)
        return


class DemoSite:
    """A static file server for ``samples/site`` on 127.0.0.1."""

    def __init__(self, port: int = 0) -> None:
        handler = functools.partial(_Quiet, directory=str(SITE_DIR))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> DemoSite:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
