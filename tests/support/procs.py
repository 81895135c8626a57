"""Worker subprocesses for the tests that run ``aiworker worker`` as its own process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from temporalio.client import Client

from aiworker.config.settings import Settings


def worker_env(client: Client, settings: Settings, data_dir: Path) -> dict[str, str]:
    """The environment of a worker process on the test's server and queue family."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env.update(
        TEMPORAL_ADDRESS=client.service_client.config.target_host,
        TEMPORAL_NAMESPACE=client.namespace,
        AIWORKER_TASK_QUEUE_SUFFIX=settings.task_queue_suffix,
        AIWORKER_METRICS_PORT="0",
        AIWORKER_DATA_DIR=str(data_dir),
        AIWORKER_ALLOW_PRIVATE_NETWORKS="true",
        AIWORKER_SHUTDOWN_GRACE_SECONDS="2",
        AIWORKER_LOG_LEVEL="WARNING",
    )
    if settings.registry_secret is not None:
        env["AIWORKER_REGISTRY_SECRET"] = settings.registry_secret.get_secret_value()
    return env


class WorkerProcess:
    """One worker process, stopped by its PID (never by name)."""

    def __init__(
        self, cmd: list[str], env: dict[str, str], log: Path, cwd: Path | None = None
    ) -> None:
        self.log = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> int:
        """SIGKILL: no drain, no goodbye; returns the exit status."""
        os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        """SIGTERM (graceful drain), SIGKILL if it takes longer than ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self._log.close()

    def output(self) -> str:
        return self.log.read_text("utf-8", errors="replace")[-4000:]


def run_cli_module(
    args: list[str], env: dict[str, str], *, timeout: float = 90, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m aiworker.workers.cli.main ARGS`` as a user runs it (in ``cwd``),
    output captured."""
    return subprocess.run(
        [sys.executable, "-m", "aiworker.workers.cli.main", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
