"""Where a running ``aiworker dev`` stack is, for the commands and scripts beside it.

``aiworker dev`` writes two files into its data directory (``./.aiworker`` by
default) once its worker polls:

- ``temporal.toml``: a ``temporalio.envconfig`` profile file (``[profile.default]``
  with the server's ``address`` and ``namespace``). It is Temporal's own
  mechanism: ``TEMPORAL_CONFIG_FILE=<it>`` points the ``temporal`` CLI, the SDK
  and every aiworker command at the stack from anywhere. It stays after the
  stack stops (a profile is configuration; with nothing listening a client
  says it cannot connect).
- ``dev.json``: the running stack's state (address, namespace, Web UI, the PIDs
  of ``aiworker dev`` and its server, the sample site, the settings its worker
  has beyond the environment's), removed on a clean stop.

A third file, ``registry.secret``, is written before the stack starts when
``AIWORKER_REGISTRY_SECRET`` is unset (:func:`ensure_registry_secret`): the
stack's worker signs its live-registry entries with it, and every command run
with the same data directory reads it as its registry secret
(``config/settings.py``), so the dev stack's registry is authenticated out of
the box. It is readable by its owner only and stays (a later stack reuses it).

envconfig has no notion of "the stack running in this folder" and no place for
the UI's address or a liveness check, hence ``dev.json``: a client that was
told nothing (no ``TEMPORAL_ADDRESS``, ``TEMPORAL_CONFIG_FILE``, profile or
address of its own) reads it from its data directory, checks cheaply that the
recorded ``aiworker dev`` process is alive and its frontend accepts a TCP
connection, and loads the profile file through envconfig
(:func:`aiworker.workers.client.temporal_client.resolve_target`). A state
whose process is gone (killed with SIGKILL, machine restarted) is ignored,
saying why. Reading the state never writes or removes anything.

Nothing here imports more than the standard library: every client reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "dev.json"
PROFILE_FILE = "temporal.toml"
# A frontend on loopback answers a TCP connect at once; this bounds a dead address.
_PROBE_SECONDS = 0.5


@dataclass(frozen=True)
class DevStack:
    """A running ``aiworker dev`` stack as its ``dev.json`` records it.

    Attributes:
        address: the Temporal frontend (``host:port``).
        namespace: the namespace the stack's worker polls.
        ui_url: the Temporal Web UI, or ``None`` when headless.
        pid: the ``aiworker dev`` process.
        server_pid: the Temporal server (a child of ``pid``).
        data_dir: the stack's data directory (absolute).
        site_url: the bundled sample site (``dev --site``), or ``None``.
        worker_env: the settings ``aiworker dev`` gave its worker beyond the
            environment's (``AIWORKER_*`` variable -> value: loopback access, the
            local model), which an ``aiworker worker`` joining the stack takes
            where its own environment is silent.
    """

    address: str
    namespace: str
    ui_url: str | None
    pid: int
    server_pid: int | None
    data_dir: str
    site_url: str | None = None
    worker_env: dict[str, str] = field(default_factory=dict)

    @property
    def state_path(self) -> Path:
        """The ``dev.json`` that records the stack."""
        return Path(self.data_dir) / STATE_FILE

    @property
    def profile_path(self) -> Path:
        """The envconfig profile file (``TEMPORAL_CONFIG_FILE``) of the stack."""
        return Path(self.data_dir) / PROFILE_FILE


def ensure_registry_secret(data_dir: Path, name: str = "registry.secret") -> None:
    """Write a random registry secret to ``data_dir/name`` (mode 0600) unless one is
    there; a concurrent writer's file wins."""
    path = data_dir / name
    if path.exists():
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secrets.token_urlsafe(32) + "\n")


def _toml_string(value: str) -> str:
    # A TOML basic string: JSON's escapes are TOML's for what an address can hold.
    return json.dumps(value)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def record(
    data_dir: Path,
    *,
    address: str,
    namespace: str,
    ui_url: str | None,
    server_pid: int | None,
    site_url: str | None = None,
    worker_env: dict[str, str] | None = None,
) -> DevStack:
    """Write the profile file and ``dev.json`` for this process's stack."""
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    stack = DevStack(
        address=address,
        namespace=namespace,
        ui_url=ui_url,
        pid=os.getpid(),
        server_pid=server_pid,
        data_dir=str(data_dir),
        site_url=site_url,
        worker_env=dict(worker_env or {}),
    )
    _write_atomically(
        stack.profile_path,
        "# Written by `aiworker dev`: the envconfig profile of its Temporal server.\n"
        "# TEMPORAL_CONFIG_FILE=<this file> points the temporal CLI and the SDK at it.\n"
        "[profile.default]\n"
        f"address = {_toml_string(address)}\n"
        f"namespace = {_toml_string(namespace)}\n",
    )
    _write_atomically(stack.state_path, json.dumps(asdict(stack), indent=2) + "\n")
    return stack


def forget(stack: DevStack) -> None:
    """Remove ``dev.json`` on a clean stop (only when it still records this stack)."""
    current = read(Path(stack.data_dir))
    if current is not None and current.pid == stack.pid:
        with contextlib.suppress(FileNotFoundError):
            stack.state_path.unlink()


def read(data_dir: Path) -> DevStack | None:
    """The stack ``data_dir/dev.json`` records, or ``None`` (absent or unreadable)."""
    try:
        raw: Any = json.loads((data_dir / STATE_FILE).read_text(encoding="utf-8"))
        return DevStack(
            address=str(raw["address"]),
            namespace=str(raw.get("namespace") or "default"),
            ui_url=raw.get("ui_url") or None,
            pid=int(raw["pid"]),
            server_pid=int(raw["server_pid"]) if raw.get("server_pid") else None,
            data_dir=str(raw.get("data_dir") or data_dir.resolve()),
            site_url=raw.get("site_url") or None,
            worker_env=_worker_env(raw.get("worker_env")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _worker_env(raw: Any) -> dict[str, str]:
    """The recorded worker settings: ``AIWORKER_*`` names with string values only
    (anything else in the file is not a setting this module wrote)."""
    if not isinstance(raw, dict):
        return {}
    return {
        k: v
        for k, v in raw.items()
        if isinstance(k, str) and k.startswith("AIWORKER_") and isinstance(v, str)
    }


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _accepts(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), _PROBE_SECONDS):
            return True
    except (OSError, ValueError):
        return False


def why_stale(stack: DevStack) -> str | None:
    """Why a recorded stack cannot be used (its process is gone, nothing listens), or None."""
    if not _process_alive(stack.pid):
        return f"its aiworker dev (pid {stack.pid}) is no longer running"
    if not _accepts(stack.address):
        return f"nothing accepts connections at {stack.address}"
    return None


def find(data_dir: Path) -> tuple[DevStack | None, str | None]:
    """The live stack recorded in ``data_dir``, or ``(None, why)`` when the recorded
    one is stale (:func:`why_stale`), or ``(None, None)`` when none is recorded."""
    stack = read(data_dir)
    if stack is None:
        return None, None
    why = why_stale(stack)
    if why is not None:
        return None, why
    return stack, None
