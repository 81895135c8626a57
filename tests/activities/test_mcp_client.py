"""The ``mcp`` tool (``activities/tools/mcp.py``) against real MCP servers on loopback.

What the agent tests (``tests/workflows/test_agent_mcp.py``) see through a
pipeline, here at the tool's edge: the streamable-HTTP transport's bounds
(a huge answer, a hang, the egress guard), a stdio server stopped when its call
is cancelled, one flooding stdout stopped at its timeout, a grandchild that left
the server's process group ended with the call, a command that does not exist,
and the servers file's checks.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import support
from support.mcp_http import running_mcp_http
from support.waiting import wait_until

from aiworker.activities.errors import WorkerError
from aiworker.activities.tools.egress import EgressPolicy
from aiworker.activities.tools.mcp import McpClient
from aiworker.config.settings import Settings, SettingsError
from aiworker.schemas.mcp import McpServer, model_name, parse_ref

SCRIPT = Path(support.__file__).parent / "mcp_server.py"


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The real MCP server over streamable HTTP on loopback; its URL."""
    with running_mcp_http() as url:
        yield url


def _client(allow_private: bool = True, **servers: McpServer) -> McpClient:
    return McpClient(servers, EgressPolicy(allow_private_networks=allow_private))


async def _code(coro: object) -> tuple[str, str]:
    try:
        await coro  # type: ignore[misc]
    except WorkerError as e:
        return e.code.value, e.message
    raise AssertionError("no error")


async def test_http_answers_and_its_bounds_each_end_in_a_stable_code(http_url: str) -> None:
    c = _client(w=McpServer(url=http_url, timeout_seconds=5, max_response_bytes=100_000))
    out = await c.call_tool("w", "t", "shout", {"text": "hi"})
    assert (out["text"], out["structured"], out["is_error"]) == ("HI!", {"result": "HI!"}, False)
    listed = {t["name"] for t in await c.list_tools("w", "t")}
    assert {"add", "shout", "hang", "crash", "huge"} <= listed
    # an answer of 3 MB against a cap of 100 kB: cut, not read
    code, message = await _code(c.call_tool("w", "t", "huge", {"mb": 3}))
    assert (code, "over 100000 bytes" in message) == ("payload_too_large", True), message
    code, message = await _code(c.call_tool("w", "t", "hang", {}))
    assert (code, message) == ("timeout", "MCP server 'w' did not answer within 5 s (http)")


async def test_the_egress_guard_refuses_a_loopback_server(http_url: str) -> None:
    by_name = http_url.replace("127.0.0.1", "localhost")
    for url in (http_url, by_name):
        c = _client(allow_private=False, w=McpServer(url=url))
        code, message = await _code(c.list_tools("w", "t"))
        assert code == "egress_denied", message
        assert message.startswith("MCP server 'w': egress to 127.0.0.1 denied"), message


def _alive(tag: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


async def test_a_cancelled_call_stops_its_stdio_server() -> None:
    tag = f"mcp-cancel-{uuid.uuid4().hex[:8]}"
    c = _client(s=McpServer(command=[sys.executable, str(SCRIPT), "stdio", tag]))
    call = asyncio.create_task(c.call_tool("s", "t", "hang", {}))
    await wait_until(lambda: _alive(tag), "the stdio server to start", timeout=20)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert _alive(tag) == []


# A stdio server that answers `initialize` (after a file exists, when one is named)
# and then does what its MODE says, written out by the tests below.
_HOSTILE = r"""
import json, os, sys, time

mode, pidfile = sys.argv[1], sys.argv[2]


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


if mode == "double-fork":
    # a daemon's double fork: the grandchild leads a session of its own (out of the
    # server's process group), keeps the inherited stdout open and never exits
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(pidfile + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            while True:
                time.sleep(1)
        os._exit(0)
    for _ in range(1000):
        if os.path.exists(pidfile):
            break
        time.sleep(0.01)
if mode == "flood-early":
    sys.stdin.readline()
    while True:  # not one message: garbage lines before any answer
        sys.stdout.write("x" * 200 + "\n")
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}}, "serverInfo": {"name": mode, "version": "0"}}})
    elif msg["method"] == "tools/list":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": [
            {"name": "anything", "inputSchema": {"type": "object"}}]}})
    elif msg["method"] == "tools/call" and mode == "flood":
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                           "params": {"level": "info", "data": "y" * 200}}) + "\n"
        while True:  # valid messages, as fast as the pipe takes them, and no answer
            sys.stdout.write(note)
    else:
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "content": [{"type": "text", "text": "done"}], "isError": False}})
"""


def _hostile(tmp_path: Path, mode: str, timeout: float = 30) -> tuple[McpClient, Path]:
    """A client of one hostile stdio server in ``mode``; the file its grandchild's PID goes to."""
    script = tmp_path / "hostile.py"
    script.write_text(_HOSTILE, "utf-8")
    pidfile = tmp_path / "grandchild.pid"
    command = [sys.executable, str(script), mode, str(pidfile)]
    return _client(s=McpServer(command=command, timeout_seconds=timeout)), pidfile


def _ended(pid: int) -> bool:
    """The process is gone, or a zombie waiting for its reaper (it runs no more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


@pytest.mark.parametrize("mode", ["flood", "flood-early"])
async def test_a_stdio_server_flooding_stdout_ends_at_its_timeout(
    tmp_path: Path, mode: str
) -> None:
    """Whatever the server writes, the call ends with ``timeout`` and the server with
    it. The bound below is generous (the server's timeout is 2 s); before, the
    call waited for pipes that a flooded, paused reader never saw close, until
    the activity's own deadline."""
    c, _ = _hostile(tmp_path, mode, timeout=2)
    call = c.call_tool("s", "t", "anything", {})
    code, message = await asyncio.wait_for(_code(call), 60)
    assert code == "timeout", message
    assert "did not answer within 2 s (stdio; its process was killed)" in message
    await wait_until(lambda: not _alive(str(tmp_path / "hostile.py")), "the flooder to end")


async def test_a_grandchild_that_left_with_setsid_ends_with_the_call(tmp_path: Path) -> None:
    """A server whose grandchild left its process group (``setsid``) and holds its
    stdout: the call answers, and the grandchild ends with it (found by the
    call's mark in its environment). Before, the call never returned: it waited
    for the pipe the grandchild held, and the grandchild ran on."""
    c, pidfile = _hostile(tmp_path, "double-fork")
    out = await asyncio.wait_for(c.call_tool("s", "t", "anything", {}), 60)
    assert out["text"] == "done"
    grandchild = int(pidfile.read_text())
    await wait_until(lambda: _ended(grandchild), f"the grandchild {grandchild} to end")
    assert not _alive(str(tmp_path / "hostile.py"))


async def test_servers_the_tenant_may_not_use_or_cannot_start() -> None:
    c = _client(
        only=McpServer(command=["true"], tenants=["acme"]),
        gone=McpServer(command=[f"/nonexistent/{uuid.uuid4().hex}"]),
    )
    assert (await _code(c.list_tools("only", "globex")))[0] == "access_denied"
    assert (await _code(c.list_tools("nosuch", "acme")))[0] == "invalid_input"
    code, message = await _code(c.list_tools("gone", "acme"))
    assert code == "not_found" and "cannot start" in message, message


@pytest.mark.parametrize(
    ("servers", "words"),
    [
        ({"x": {}}, "exactly one of 'command' (stdio) and 'url' (HTTP)"),
        ({"x": {"command": ["a"], "url": "http://h/mcp"}}, "exactly one of"),
        ({"Bad Name": {"command": ["a"]}}, "servers.Bad Name.[key]"),
        ({"x": {"url": "ftp://h/"}}, "servers.x.url"),
        ({"x": {"command": ["a"], "tenants": ["ACME"]}}, "servers.x.tenants.0"),
        ({"x": {"command": ["a"], "timeout_seconds": "5"}}, "servers.x.timeout_seconds"),
    ],
)
def test_a_bad_servers_file_stops_the_settings_naming_the_field(
    tmp_path: Path, servers: dict[str, object], words: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": servers}), "utf-8")
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"AIWORKER_MCP_SERVERS_FILE": str(path)})
    assert str(e.value).startswith(f"AIWORKER_MCP_SERVERS_FILE: {path}: ")
    assert words in str(e.value), str(e.value)


def test_tool_names_for_the_model_are_what_providers_accept() -> None:
    assert parse_ref("mcp:calc/add") == ("calc", "add")
    assert parse_ref("mcp:calc/*") == ("calc", "*")
    assert parse_ref("mcp:Calc/add") is None and parse_ref("mcp:calc") is None
    assert model_name("calc", "add") == "mcp__calc__add"
    assert model_name("calc", "v1.add") == "mcp__calc__v1_add"
    long = model_name("calc", "t" * 128)
    assert len(long) == 64 and long != model_name("calc", "t" * 127)
