"""Starting reliably: ``aiworker worker`` and ``aiworker dev`` wait (bounded) for
a healthy frontend, say clearly when it never is, and a dev stack killed with
SIGKILL leaves no Temporal server and no local model server behind.

Each test runs its own processes and servers on free loopback ports, and
stops every one of them by the PID it recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.procs import WorkerProcess
from support.waiting import wait_until

from aiworker.workers.devstack.devserver import DevServer, free_port

AIWORKER = str(Path(sys.executable).parent / "aiworker")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env.update(AIWORKER_LOG_LEVEL="WARNING", AIWORKER_SHUTDOWN_GRACE_SECONDS="2", **extra)
    return env


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot): tells it from a later process
    that was given the same PID."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _alive(pid: int, started: str | None = None) -> bool:
    """Whether ``pid`` runs (a zombie nobody has reaped yet counts as gone), and is
    still the process that began at ``started`` when that is given."""
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return False
    return started is None or (len(fields) > 19 and fields[19] == started)


@contextlib.contextmanager
def _mute_frontend() -> Iterator[int]:
    """A loopback port that accepts connections and never speaks gRPC."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn, _ = sock.accept()
                conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop.set()
        t.join(5)
        sock.close()


def _ready(port: int) -> bool:
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return bool(r.status == 200)
    return False


@pytest.mark.timeout(120)
async def test_worker_started_before_its_server_waits_then_serves(tmp_path: Path) -> None:
    port, metrics = free_port(), free_port()
    env = _env(
        TEMPORAL_ADDRESS=f"127.0.0.1:{port}",
        AIWORKER_METRICS_PORT=str(metrics),
        AIWORKER_DATA_DIR=str(tmp_path / "data"),
    )
    worker = WorkerProcess([AIWORKER, "worker", "--wait", "90"], env, tmp_path / "worker.log")
    server = DevServer(tmp_path / "dev", port=port, ui_port=None, persistent=False)
    try:
        await wait_until(
            lambda: "waiting for Temporal at" in worker.output(),
            lambda: f"the worker to say it waits: {worker.output()}",
        )
        assert worker.proc.poll() is None, worker.output()
        server.start()
        await wait_until(
            lambda: asyncio.to_thread(_ready, metrics),
            lambda: f"the worker to poll: {worker.output()}",
            timeout=120,  # a new build's first poll may wait out a long poll (~60 s)
            interval=0.5,
        )
    finally:
        worker.terminate()
        worker.close()
        server.stop()


async def test_worker_says_when_the_frontend_never_becomes_healthy(tmp_path: Path) -> None:
    with _mute_frontend() as port:
        env = _env(
            TEMPORAL_ADDRESS=f"127.0.0.1:{port}",
            AIWORKER_METRICS_PORT="0",
            AIWORKER_DATA_DIR=str(tmp_path / "data"),
        )
        proc = await asyncio.to_thread(
            subprocess.run,
            [AIWORKER, "worker", "--wait", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"aiworker: cannot reach Temporal: Temporal at 127\.0\.0\.1:{port} was not healthy "
        r"within 2s \(.+\)",
        last,
    ), proc.stderr
    assert "Traceback" not in proc.stderr


def _start_dev(tmp_path: Path) -> WorkerProcess:
    """``aiworker dev`` (headless, no model configured) on a free port, data in tmp_path/dev."""
    data = tmp_path / "dev"
    return WorkerProcess(
        [AIWORKER, "dev", "--data-dir", str(data), "--port", str(free_port()), "--headless"],
        _env(AIWORKER_METRICS_PORT="0"),
        tmp_path / "dev.out",
    )


async def _dev_ready(dev: WorkerProcess) -> int:
    """Wait until the dev stack serves; the PID of its local model server."""
    await wait_until(
        lambda: "Press Ctrl-C" in dev.output(),
        lambda: f"the dev stack to start: {dev.output()}",
        timeout=90,
        interval=0.5,
    )
    found = re.search(r"llama-server pid (\d+)", dev.output())
    assert found, dev.output()
    return int(found.group(1))


def _temporal_pid(data: Path) -> int:
    lock = (data / "dev.lock").read_text()
    found = re.search(r"server pid (\d+)", lock)
    assert found, lock
    return int(found.group(1))


@pytest.mark.timeout(120)
async def test_dev_killed_with_sigkill_leaves_no_server(tmp_path: Path) -> None:
    data = tmp_path / "dev"
    dev = _start_dev(tmp_path)
    server_pid = model_pid = None
    started: dict[int, str | None] = {}
    try:
        model_pid = await _dev_ready(dev)
        server_pid = _temporal_pid(data)
        started = {pid: _started(pid) for pid in (server_pid, model_pid)}
        server_started, model_started = started[server_pid], started[model_pid]
        assert _alive(server_pid)
        assert _alive(model_pid)
        dev.kill()
        await wait_until(
            lambda: not _alive(server_pid, server_started),
            f"the Temporal server (pid {server_pid}) to exit with its parent",
            timeout=30,
        )
        await wait_until(
            lambda: not _alive(model_pid, model_started),
            f"the local model server (pid {model_pid}) to exit with its parent",
            timeout=30,
        )
    finally:
        dev.close()
        for pid in (server_pid, model_pid):
            if pid is not None and _alive(pid, started.get(pid)):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(120)
async def test_dev_notices_its_local_model_killed_and_stops(tmp_path: Path) -> None:
    dev = _start_dev(tmp_path)
    model_pid = None
    try:
        model_pid = await _dev_ready(dev)
        os.kill(model_pid, signal.SIGKILL)
        code = await asyncio.to_thread(dev.proc.wait, 60)
        out = dev.output()
        assert code == 2, out
        assert "aiworker: the local model server stopped; stopping" in out
        last = out.strip().splitlines()[-1]
        assert last.startswith(
            f"aiworker: the local model server (llama-server, pid {model_pid}) exited with "
            "code -9; last lines of "
        ), out
        assert "Traceback" not in out
        assert not _alive(_temporal_pid(tmp_path / "dev")), "the Temporal server outlived it"
    finally:
        dev.close()
        if model_pid is not None and _alive(model_pid):
            os.kill(model_pid, signal.SIGKILL)
