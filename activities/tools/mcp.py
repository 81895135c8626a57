"""The ``mcp`` tool: list and call the tools of an MCP server, bounded.

One :class:`McpClient` per worker process holds the servers of
``AIWORKER_MCP_SERVERS_FILE`` (:mod:`aiworker.schemas.mcp`); the ``mcp-call``
worker reaches it through its toolbox. Each listing and each tool call opens
its own MCP session (the ``mcp`` package's ``ClientSession``) and closes it
before the activity returns:

- **stdio** servers are started per call, not pooled per process. A pooled
  server would outlive the activity that started it (a worker restart, a
  cancelled call, a crash of the server between calls would each need their
  own bookkeeping), share state between tenants' calls, and a hung one would
  hold every later call. Per call, the process belongs to one activity: it is
  started in a session of its own with a per-call mark in its environment
  (:data:`CALL_MARK`), and always stopped in a ``finally``, cancelled or not:
  stdin closed, then ``SIGKILL`` to its process group and to every process
  that carries the mark, so that a descendant that left the group
  (``setsid``, a daemon's double fork) ends with the call too
  (:func:`kill_marked`). No wait on the way is unbounded, whatever the server
  writes or whoever holds its pipes. The price is the start of the server
  process on every call (see docs/benchmarks.md).
- **streamable HTTP** servers are reached with an ``httpx2`` client (what
  ``mcp`` 2 speaks) whose connections go through the egress guard
  (:class:`~aiworker.activities.tools.egress.EgressPolicy`, checked on the URL
  and on every address at connect time), with retries off (Temporal retries).

Bounds, each a stable code: connecting, ``initialize`` and the request
together within the server's ``timeout_seconds`` (``timeout``, retryable; a
stdio server is killed, and the timeout holds while it floods stdout); one
message larger than ``max_response_bytes`` (a tool list or result of
gigabytes: ``payload_too_large``, the read stops there and a stdio server is
killed); a server that exits or drops the
connection (``upstream_error``, retryable, with the tail of its stderr);
a listing of more than :data:`~aiworker.schemas.mcp.MAX_TOOLS` tools or a
tool input schema that is not a valid, safe JSON Schema (``invalid_output``:
the server's answer is wrong); a result whose structured content misses the
output schema the server declared for the tool (``invalid_output``).

The stdio transport is written here rather than taken from
``mcp.client.stdio``: that one reads a line of any length into memory, so a
server answering gigabytes would exhaust the worker; this one reads through
an ``asyncio`` stream whose buffer limit is the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpcore2
import httpx2
import mcp_types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from aiworker.activities.errors import (
    AccessDeniedError,
    EgressDeniedError,
    InvalidInputError,
    InvalidOutputError,
    NotFoundError,
    PayloadTooLargeError,
    UpstreamError,
    WorkerError,
    WorkerTimeoutError,
)
from aiworker.activities.tools.egress import EgressPolicy, ResolveError, connect_first
from aiworker.schemas import messages, safe_schema
from aiworker.schemas.mcp import MAX_TOOLS, McpServer

_E = TypeVar("_E", bound=BaseException)

# How long a stdio server has to exit after its stdin closes, before SIGKILL.
_EXIT_GRACE_SECONDS = 0.5
# How long a killed server has to be reaped before its pipes are closed regardless.
_REAP_SECONDS = 2.0
_EXIT_POLL_SECONDS = 0.01
# Passes over /proc for processes that carry a call's mark (see kill_marked).
_KILL_PASSES = 20
CALL_MARK = "AIWORKER_MCP_CALL"
"""The environment variable each stdio server process is started with, a
random value per call: what finds the processes it started (:func:`kill_marked`)."""
# The tail of a stdio server's stderr kept for error messages.
_STDERR_TAIL = 2000


@dataclass
class _Wire:
    """What the transport saw, for the error a failed session maps to."""

    too_large: bool = False
    exit_code: int | None = None
    stderr: bytearray = field(default_factory=bytearray)
    egress: EgressDeniedError | None = None

    def tail(self) -> str:
        text = self.stderr.decode("utf-8", "replace").strip()
        return f": {text[-500:]}" if text else ""


class _TooLarge(Exception):
    pass


class McpClient:
    """The servers this process may reach, and one bounded session per operation."""

    def __init__(
        self,
        servers: dict[str, McpServer],
        egress: EgressPolicy,
    ) -> None:
        self.servers = servers
        self.egress = egress

    @classmethod
    def from_settings(cls, settings: Any, **egress_kw: Any) -> McpClient:
        servers = settings.mcp_servers.servers if settings.mcp_servers is not None else {}
        return cls(dict(servers), EgressPolicy.from_settings(settings, **egress_kw))

    def server(self, name: str, tenant: str) -> McpServer:
        """The server ``name`` if ``tenant`` may use it (``invalid_input`` when there is
        no such server, ``access_denied`` when the tenant is not among its tenants)."""
        server = self.servers.get(name)
        if server is None:
            known = ", ".join(sorted(self.servers)) or "none: AIWORKER_MCP_SERVERS_FILE is not set"
            raise InvalidInputError(
                f"unknown MCP server {name!r} (known: {known})", field="input.server"
            )
        if not server.allows(tenant):
            raise AccessDeniedError(
                f"tenant {tenant!r} may not use MCP server {name!r} "
                "(its 'tenants' in AIWORKER_MCP_SERVERS_FILE)",
                field="input.server",
            )
        return server

    async def list_tools(self, name: str, tenant: str) -> list[dict[str, Any]]:
        """The server's tools: ``name``, ``description``, ``input_schema`` and
        ``output_schema`` (when it declares one), each schema checked."""
        server = self.server(name, tenant)
        tools: list[mcp_types.Tool] = []
        async with self._session(name, server) as session:
            cursor: str | None = None
            for _ in range(MAX_TOOLS):  # pages; a server that pages forever is cut here
                params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_tools(params=params)
                tools.extend(page.tools)
                if len(tools) > MAX_TOOLS:
                    raise InvalidOutputError(
                        f"MCP server {name!r} lists more than {MAX_TOOLS} tools"
                    )
                cursor = page.next_cursor
                if not cursor:
                    break
        return [_listed(name, t) for t in tools]

    async def call_tool(
        self,
        name: str,
        tenant: str,
        tool: str,
        arguments: dict[str, Any],
        output_schema: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One tool call: ``text`` (the text blocks), ``structured`` (when the server
        sends structured content, checked against ``output_schema``) and ``is_error``."""
        server = self.server(name, tenant)
        async with self._session(name, server) as session:
            result = await session.call_tool(tool, arguments)
        structured = result.structured_content
        if output_schema is not None and not result.is_error:
            if structured is None:
                raise InvalidOutputError(
                    f"MCP tool {name}/{tool} declares an output schema and answered "
                    "without structured content"
                )
            problems = messages.reasons(
                safe_schema.errors(safe_schema.validator(output_schema), structured)
            )
            if problems:
                detail = "; ".join(f"{p['path']}: {p['message']}" for p in problems[:5])
                raise InvalidOutputError(
                    f"MCP tool {name}/{tool} answered against its own output schema: {detail}",
                    reasons=problems,
                )
        out: dict[str, Any] = {"text": _text(result.content), "is_error": bool(result.is_error)}
        if structured is not None:
            out["structured"] = structured
        return out

    @contextlib.asynccontextmanager
    async def _session(self, name: str, server: McpServer) -> AsyncIterator[ClientSession]:
        """An initialized session, the whole of its use within ``timeout_seconds``;
        a transport failure becomes the stable error it stands for."""
        wire = _Wire()
        try:
            with anyio.fail_after(server.timeout_seconds):
                async with contextlib.AsyncExitStack() as stack:
                    if server.command is not None:
                        read, write = await stack.enter_async_context(_stdio(server, wire))
                    else:
                        assert server.url is not None
                        try:
                            self.egress.check_url(server.url)
                        except EgressDeniedError as e:
                            raise EgressDeniedError(f"MCP server {name!r}: {e.message}") from None
                        read, write = await stack.enter_async_context(
                            _http(server, self.egress, wire)
                        )
                    session = await stack.enter_async_context(ClientSession(read, write))
                    await session.initialize()
                    yield session
        except WorkerError:
            raise
        except TimeoutError:
            raise WorkerTimeoutError(
                f"MCP server {name!r} did not answer within {server.timeout_seconds:g} s "
                f"({server.transport}{'; its process was killed' if server.command else ''})"
            ) from None
        except BaseException as e:
            if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                raise
            raise _mapped(name, server, wire, e) from None


def _mapped(name: str, server: McpServer, wire: _Wire, e: BaseException) -> WorkerError:
    """The stable error of a failed session (the wire's record first: a cut answer
    or a refused address explains any error that followed it)."""
    if wire.too_large or _has(e, _TooLarge):
        return PayloadTooLargeError(
            f"MCP server {name!r} sent a message over {server.max_response_bytes} bytes "
            "(its max_response_bytes); the read was stopped"
            + ("" if server.url else " and the process killed")
        )
    denied = wire.egress or _find(e, EgressDeniedError)
    if denied is not None:
        return EgressDeniedError(f"MCP server {name!r}: {denied.message}")
    if wire.exit_code is not None:
        return UpstreamError(
            f"MCP server {name!r} exited with code {wire.exit_code} mid-session{wire.tail()}"
        )
    if isinstance(e, FileNotFoundError | PermissionError):
        return NotFoundError(f"MCP server {name!r}: cannot start {server.command!r}: {e}")
    detail = _detail(e)
    if "Invalid structured content" in detail:  # the mcp session's own output check
        return InvalidOutputError(
            f"MCP server {name!r} answered against its own output schema: {detail[:300]}"
        )
    return UpstreamError(f"MCP server {name!r} failed: {detail}{wire.tail()}")


def _leaves(e: BaseException) -> Iterable[BaseException]:
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            yield from _leaves(sub)
    else:
        yield e
        if e.__cause__ is not None:
            yield from _leaves(e.__cause__)


def _find(e: BaseException, kind: type[_E]) -> _E | None:
    for leaf in _leaves(e):
        if isinstance(leaf, kind):
            return leaf
    return None


def _has(e: BaseException, kind: type[BaseException]) -> bool:
    return _find(e, kind) is not None


def _detail(e: BaseException) -> str:
    leaves = list(_leaves(e))
    first = leaves[0] if leaves else e
    return f"{type(first).__name__}: {first}"[:500]


def _listed(server: str, tool: mcp_types.Tool) -> dict[str, Any]:
    """One tool of a listing as the worker's output has it, its schemas checked."""
    for what, schema in (("input", tool.input_schema), ("output", tool.output_schema)):
        if schema is None:
            continue
        problems = safe_schema.problems(schema)
        if not isinstance(schema, dict) or problems:
            raise InvalidOutputError(
                f"MCP server {server!r} declares an {what} schema for tool {tool.name!r} that "
                f"is not a valid JSON Schema aiworker applies: {'; '.join(problems[:3])}",
                tool=tool.name,
            )
    out: dict[str, Any] = {
        "name": tool.name,
        "description": (tool.description or "")[:4000],
        "input_schema": tool.input_schema,
    }
    if tool.output_schema is not None:
        out["output_schema"] = tool.output_schema
    return out


def _text(blocks: Iterable[Any]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, mcp_types.TextContent):
            parts.append(b.text)
        else:
            parts.append(f"[{getattr(b, 'type', 'content')} content omitted]")
    return "\n".join(parts)


# --- stdio ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _stdio(server: McpServer, wire: _Wire) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server, bridge its pipes to the session's streams, stop it and
    everything it started (:func:`_stop`)."""
    assert server.command is not None
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    env.update(server.env)
    env[CALL_MARK] = uuid.uuid4().hex
    mark = f"{CALL_MARK}={env[CALL_MARK]}"
    proc = await asyncio.create_subprocess_exec(
        *server.command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own process group: its children are stopped with it
        limit=server.max_response_bytes,
    )
    try:
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

        async def stdout_reader() -> None:
            assert proc.stdout is not None
            async with read_send:
                while True:
                    try:
                        line = await proc.stdout.readuntil(b"\n")
                    except asyncio.IncompleteReadError:
                        # stdout ended: the exit code, if it comes (not proc.wait(): a
                        # descendant holding stderr would hold it, see _stop)
                        if await _exited(proc, _REAP_SECONDS):
                            wire.exit_code = proc.returncode
                        return
                    except (asyncio.LimitOverrunError, ValueError):
                        wire.too_large = True
                        _kill(proc)
                        return
                    try:
                        msg: SessionMessage | Exception = SessionMessage(
                            mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        )
                    except ValueError as e:
                        msg = e
                    try:
                        await read_send.send(msg)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return

        async def stderr_reader() -> None:
            assert proc.stderr is not None
            while chunk := await proc.stderr.read(4096):
                wire.stderr += chunk
                del wire.stderr[:-_STDERR_TAIL]

        async def stdin_writer() -> None:
            assert proc.stdin is not None
            async with write_recv:
                async for m in write_recv:
                    data = m.message.model_dump_json(by_alias=True, exclude_unset=True)
                    try:
                        proc.stdin.write(data.encode() + b"\n")
                        await proc.stdin.drain()
                    except (BrokenPipeError, ConnectionResetError):
                        return

        async with anyio.create_task_group() as tg:
            tg.start_soon(stdout_reader)
            tg.start_soon(stderr_reader)
            tg.start_soon(stdin_writer)
            try:
                yield read_recv, write_send
            finally:
                tg.cancel_scope.cancel()
                await write_send.aclose()
                await read_recv.aclose()
    finally:
        await _stop(proc, mark)


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the server's process group (its PID: it leads a session of its own)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


async def _stop(proc: asyncio.subprocess.Process, mark: str) -> None:
    """Close stdin, give the server a moment to exit, then kill its process group
    and every process that carries the call's mark; never waits unbounded.

    Shielded: a cancelled call stops its server all the same. The server's
    exit is read from ``returncode``, not ``proc.wait()``: that also waits for
    the pipes to close, which a descendant holding them keeps open, and which a
    flooded stdout whose reading asyncio paused never reports (the call hung
    there, past its timeout, until the activity's deadline). The pipes are
    closed here instead, whatever still holds their other end.
    """
    with anyio.CancelScope(shield=True):
        if proc.stdin is not None:
            proc.stdin.close()
        await _exited(proc, _EXIT_GRACE_SECONDS)
        _kill(proc)
        # a child that left the group's leader behind goes too (the group outlives
        # its leader), and so does one that left the group with setsid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await anyio.to_thread.run_sync(kill_marked, mark)
        await _exited(proc, _REAP_SECONDS)
        transport = getattr(proc, "_transport", None)  # asyncio has no public close
        if transport is not None:
            transport.close()


async def _exited(proc: asyncio.subprocess.Process, seconds: float) -> bool:
    """Whether the process has exited within ``seconds``: polled, because the one
    event asyncio gives (``wait()``) also waits for the pipes (see :func:`_stop`)."""
    for _ in range(max(1, round(seconds / _EXIT_POLL_SECONDS))):
        if proc.returncode is not None:
            return True
        await anyio.sleep(_EXIT_POLL_SECONDS)
    return proc.returncode is not None


def kill_marked(mark: str) -> int:
    """SIGKILL every process whose environment holds ``mark`` (``NAME=value``);
    how many were signalled.

    A stdio server runs in a process group of its own, but anything it starts
    may leave that group (``setsid``, a double fork: what a daemon does) and
    would outlive the call. Every process inherits the environment it was
    started with, so the per-call :data:`CALL_MARK` variable names all of them
    wherever they went, read from ``/proc/<pid>/environ``: as the same user
    (no root needed; a process of another user is not the server's and cannot
    be read), and without touching the worker process's own children or
    signals (``PR_SET_CHILD_SUBREAPER`` would make the whole worker process the
    reaper of every orphan, its other calls' included). Only a process that
    rewrites or drops its environment on purpose escapes the mark.

    Scanned again after each kill, until a pass finds none (bounded: a process
    forked between the scan and the kill is found by the next pass). Each
    process is signalled through a pidfd where the platform has one, so a PID
    reused between the read and the signal is never hit.
    """
    entry = mark.encode()
    total = 0
    for _ in range(_KILL_PASSES):
        found = 0
        for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
            if not name.isdigit() or int(name) == os.getpid():
                continue
            found += _kill_if_marked(int(name), entry)
        total += found
        if not found:
            break
    return total


def _kill_if_marked(pid: int, entry: bytes) -> int:
    pidfd: int | None = None
    try:
        if hasattr(os, "pidfd_open"):
            pidfd = os.pidfd_open(pid)  # held from before the read: the PID cannot move
        with open(f"/proc/{pid}/environ", "rb") as f:
            if entry not in f.read().split(b"\0"):
                return 0
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return 1
    except OSError:  # gone, or another user's (not ours to read)
        return 0
    finally:
        if pidfd is not None:
            os.close(pidfd)


# --- streamable HTTP -----------------------------------------------------------------


class _GuardedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's backend (``httpx2``'s) connecting only to vetted addresses: the
    same policy as the fetch tool's aiohttp client
    (:mod:`~aiworker.activities.tools.http_client`)."""

    def __init__(self, policy: EgressPolicy, wire: _Wire) -> None:
        self.policy = policy
        self.wire = wire
        self.inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            addrs = await self.policy.resolve(host, port)
        except EgressDeniedError as e:
            self.wire.egress = e
            raise
        except ResolveError as e:
            raise httpcore2.ConnectError(str(e)) from e
        return await connect_first(
            addrs,
            lambda addr: self.inner.connect_tcp(
                addr,
                port,
                timeout=timeout,
                local_address=local_address,
                socket_options=socket_options,
            ),
            httpcore2.ConnectError,
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise EgressDeniedError("unix sockets are not an allowed egress", path=path)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class _CappedStream(httpx2.AsyncByteStream):
    """A response body that stops after ``cap`` bytes."""

    def __init__(self, inner: httpx2.AsyncByteStream, cap: int, wire: _Wire) -> None:
        self.inner, self.cap, self.wire, self.seen = inner, cap, wire, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.seen += len(chunk)
            if self.seen > self.cap:
                self.wire.too_large = True
                raise _TooLarge(f"response over {self.cap} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CappedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncHTTPTransport, cap: int, wire: _Wire) -> None:
        self.inner, self.cap, self.wire = inner, cap, wire

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        length = response.headers.get("content-length")
        if length is not None and length.isascii() and length.isdigit() and int(length) > self.cap:
            await response.aclose()
            self.wire.too_large = True
            raise _TooLarge(f"response of {length} bytes")
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        response.stream = _CappedStream(stream, self.cap, self.wire)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def _http(
    server: McpServer, policy: EgressPolicy, wire: _Wire
) -> AsyncIterator[tuple[Any, Any]]:
    assert server.url is not None
    inner = httpx2.AsyncHTTPTransport(retries=0, trust_env=False)
    # httpx2 has no public hook for the network backend; its pool is httpcore2's
    inner._pool = httpcore2.AsyncConnectionPool(
        ssl_context=httpx2.create_ssl_context(),
        max_connections=4,
        retries=0,
        network_backend=_GuardedBackend(policy, wire),
    )
    client = httpx2.AsyncClient(
        transport=_CappedTransport(inner, server.max_response_bytes, wire),
        timeout=httpx2.Timeout(server.timeout_seconds),
        trust_env=False,
    )
    async with client:
        async with streamable_http_client(
            server.url, http_client=client, max_sse_event_size=server.max_response_bytes
        ) as streams:
            yield streams


__all__ = ["McpClient"]
