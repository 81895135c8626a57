"""The ``mcp`` tool (``activities/tools/mcp.py``) against real MCP servers on loopback.

What the agent tests (``tests/workflows/test_agent_mcp.py``) see through a
pipeline, here at the tool's edge: the streamable-HTTP transport's bounds
(a huge answer, a hang, the egress guard), a stdio server stopped when its call
is cancelled, a command that does not exist, and the servers file's checks.
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
