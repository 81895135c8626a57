"""The test MCP server (``support/mcp_server.py``) over streamable HTTP on loopback,
started by a test and stopped by the PID it recorded."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from aiworker.workers.devstack.devserver import free_port, stop_child
from support.waiting import wait_until

SCRIPT = Path(__file__).parent / "mcp_server.py"


@contextmanager
def running_mcp_http() -> Iterator[str]:
    """The server listening on a free loopback port; its URL (``.../mcp``)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/mcp"

    def up() -> bool:
        try:
            httpx.get(url, timeout=1)
        except httpx.HTTPError:
            return False
        return True

    try:
        asyncio.run(wait_until(up, "the MCP HTTP server to listen", timeout=30))
        yield url
    finally:
        stop_child(proc, timeout=5)
