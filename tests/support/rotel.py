"""A real OTLP receiver on loopback: rotel (the ``rotel`` test dependency).

rotel is a small OpenTelemetry collector whose wheel ships its own binary.
:class:`Rotel` starts it on free loopback ports with a blackhole exporter and
its debug log on (every span, metric data point and log record it receives,
written in the OpenTelemetry collector's "detailed" text), and stops it by its
PID. :meth:`Rotel.blocks` splits that text into one block per span, metric or
log record, each a dict of its ``-> key: Str(value)`` attributes plus the
block's own header fields, so tests assert on what arrived.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def rotel_binary() -> Path:
    import rotel

    return Path(rotel.__file__).parent / "rotel-agent"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Block:
    """One received span, metric or log record."""

    kind: str  # "Span", "Metric", "LogRecord"
    header: dict[str, str] = field(default_factory=dict)
    attributes: dict[str, str] = field(default_factory=dict)
    resource: dict[str, str] = field(default_factory=dict)
    points: list[dict[str, str]] = field(default_factory=list)


_ATTR = re.compile(r"^\s*-> ([^:]+): (?:\w+\((.*)\)|(.*))$")
_HEAD = re.compile(r"^(Resource\w+|Scope\w+|Span|Metric|LogRecord|\w+DataPoints) #\d+")
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z ]*?)\s*:\s?(.*)$")


class Rotel:
    """rotel on loopback; ``endpoint`` is its OTLP/HTTP base URL."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.http_port = _free_port()
        self.grpc_port = _free_port()
        self.out = workdir / "rotel.out"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> Rotel:
        cmd = [
            str(rotel_binary()),
            "start",
            "--exporter",
            "blackhole",
            "--debug-log",
            "traces",
            "--debug-log",
            "metrics",
            "--debug-log",
            "logs",
            "--debug-log-verbosity",
            "detailed",
            "--otlp-http-endpoint",
            f"127.0.0.1:{self.http_port}",
            "--otlp-grpc-endpoint",
            f"127.0.0.1:{self.grpc_port}",
            "--pid-file",
            str(self.workdir / "rotel.pid"),
            "--log-file",
            str(self.workdir / "rotel.log"),
        ]
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir, env=_env()
            )
        return self

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"rotel exited: {self.text()[-2000:]}")
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.http_port), timeout=0.5),
        ):
            return True
        return False

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def text(self) -> str:
        return self.out.read_text("utf-8", errors="replace") if self.out.exists() else ""

    def blocks(self, kind: str | None = None) -> list[Block]:
        """Every span (``Span``), metric (``Metric``) or log record (``LogRecord``) received."""
        out: list[Block] = []
        resource: dict[str, str] = {}
        in_resource = False
        current: Block | None = None
        point: dict[str, str] | None = None
        for raw in re.sub(r"\x1b\[[0-9;]*m", "", self.text()).splitlines():
            line = raw.rstrip()
            head = _HEAD.match(line)
            if head:
                name = head.group(1)
                if name.startswith("Resource"):
                    resource, in_resource, current = {}, True, None
                elif name in ("Span", "Metric", "LogRecord"):
                    current = Block(name, resource=dict(resource))
                    out.append(current)
                    in_resource, point = False, None
                elif name.endswith("DataPoints") and current is not None:
                    point = {}
                    current.points.append(point)
                else:
                    in_resource = False
                continue
            m = _ATTR.match(line)
            if m:
                key = m.group(1).strip()
                if m.group(2) is None:  # a descriptor field (-> Name: x), not an attribute
                    if current is not None:  # (a span event's "-> Name" is not the span's)
                        current.header.setdefault(key, (m.group(3) or "").strip())
                    continue
                value = m.group(2)
                if in_resource:
                    resource[key] = value
                elif point is not None:
                    point[key] = value
                elif current is not None:
                    current.attributes[key] = value
                continue
            f = _FIELD.match(line)
            if f and current is not None:
                target = point if point is not None else current.header
                target.setdefault(f.group(1).strip(), f.group(2).strip())
        return [b for b in out if kind is None or b.kind == kind]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("ROTEL_", "OTEL_"))}


@contextlib.contextmanager
def running_rotel(workdir: Path) -> Iterator[Rotel]:
    """rotel started in ``workdir`` and stopped by its PID at the end."""
    r = Rotel(workdir).start()
    try:
        yield r
    finally:
        r.stop()
