"""Slow clients against ``aiworker serve``: file descriptors before and after a slowloris burst.

Two front doors in the same run, each its own ``aiworker serve`` process on
loopback (no Temporal needed: ``/healthz`` asks nothing of it): one with the
default header deadline cut to a few seconds, one with a deadline of an hour
(what every door had before ``AIWORKER_SERVE_HEADER_TIMEOUT_SECONDS``). Each
receives the same burst: N connections that send a request line and then
one header line every 0.5 s, forever. After the deadline has passed (plus
a margin), the descriptors the process holds are counted again.

``ratio``: descriptors after the burst / before it, with the deadline (1.0 is
all slow sockets dropped); ``ratio_without_deadline`` the same for the door
that keeps them (about (N + before) / before).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import standalone

_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _door(header_timeout: float, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env |= {
        "TEMPORAL_ADDRESS": "127.0.0.1:9",
        "AIWORKER_LOG_LEVEL": "ERROR",
        "AIWORKER_SERVE_HEADER_TIMEOUT_SECONDS": str(header_timeout),
    }
    cmd = [sys.executable, "-m", "aiworker.workers.cli.main", "serve", "--host", "127.0.0.1"]
    out = open(log, "wb")
    # no API key: the burst never gets past the headers, so no request needs one
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--without-api-keys"],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = _LISTENING.search(log.read_text())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"aiworker serve exited: {log.read_text()}")
        await asyncio.sleep(0.1)
    raise RuntimeError("aiworker serve did not listen")


async def _burst(port: int, n: int, hold_seconds: float) -> None:
    """``n`` slowloris connections for ``hold_seconds``."""

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            end = time.monotonic() + hold_seconds
            while time.monotonic() < end and not reader.at_eof():
                await asyncio.sleep(0.5)
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(n)))


async def _measure(header_timeout: float, n: int, tmp: Path) -> dict[str, float]:
    proc, port = await _door(header_timeout, tmp / f"serve-{header_timeout:g}.log")
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            await http.get(f"http://127.0.0.1:{port}/healthz")
        await asyncio.sleep(6)  # the kept-alive probe connection times out (uvicorn: 5 s)
        before = _fds(proc.pid)
        peak = before
        hold = 3.0 + 4.0  # past the short deadline, with a margin
        burst = asyncio.create_task(_burst(port, n, hold + 5))
        end = time.monotonic() + hold
        while time.monotonic() < end:
            await asyncio.sleep(0.25)
            peak = max(peak, _fds(proc.pid))
        after = _fds(proc.pid)
        burst.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await burst
        return {"fds_before": before, "fds_peak": peak, "fds_after": after}
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


async def run(quick: bool = False) -> dict[str, Any]:
    n = 60 if quick else 300
    with tempfile.TemporaryDirectory(prefix="aiworker-bench-slowloris-") as tmp:
        held = await _measure(3.0, n, Path(tmp))
        kept = await _measure(3600.0, n, Path(tmp))
    return {
        "connections": n,
        "with_deadline": held,
        "without_deadline": kept,
        "ratio": round(held["fds_after"] / held["fds_before"], 2),
        "ratio_without_deadline": round(kept["fds_after"] / kept["fds_before"], 2),
        "command": f"{'BENCH_QUICK=1 ' if quick else ''}.venv/bin/python -m bench.slowloris",
    }


if __name__ == "__main__":
    standalone(run)
