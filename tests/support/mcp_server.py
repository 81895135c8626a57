"""MCP servers for the tests: a real one (the ``mcp`` package's ``MCPServer``,
formerly FastMCP) and hand-written hostile ones.

``python tests/support/mcp_server.py stdio [TAG]`` serves the real tools over
stdio (TAG is ignored: tests find their server processes by it);
``... http PORT`` over streamable HTTP on 127.0.0.1:PORT. The real tools:
``add`` (structured output), ``shout``, ``hang`` (never answers), ``crash``
(the process exits mid-call), ``huge`` (an answer of ``mb`` megabytes).

``... raw MODE`` is a minimal JSON-RPC stdio server that answers
``initialize`` and then misbehaves on purpose (MODE):

- ``bad-schema``: lists a tool whose input schema is no valid JSON Schema
  (and one whose ``$ref`` points to a URL);
- ``lying-output``: lists ``count`` with an output schema and answers it with
  structured content that does not match it;
- ``huge-list``: answers ``tools/list`` with one line of 50 MB;
- ``hang-init``: never answers ``initialize``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def real(transport: str, port: int = 0) -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("aiworker-test")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    @server.tool(description="Upper-case a text and add a mark.")
    def shout(text: str) -> str:
        return text.upper() + "!"

    @server.tool(description="Never answers.")
    def hang() -> str:
        time.sleep(3600)
        return "late"

    @server.tool(description="The process dies mid-call.")
    def crash() -> str:
        os._exit(3)

    @server.tool(description="An answer of `mb` megabytes.")
    def huge(mb: int) -> str:
        return "x" * (mb * 1_000_000)

    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def raw(mode: str) -> None:
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            continue  # a notification
        if method == "initialize":
            if mode == "hang-init":
                time.sleep(3600)
            _send(
                {
                    "jsonrpc": "2.0",
                    "id": mid,
                    "result": {
                        "protocolVersion": msg["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": f"raw-{mode}", "version": "0"},
                    },
                }
            )
        elif method == "tools/list":
            if mode == "huge-list":
                big = "y" * 50_000_000
                tools = [{"name": "big", "description": big, "inputSchema": {"type": "object"}}]
            elif mode == "bad-schema":
                tools = [
                    {"name": "broken", "inputSchema": {"type": "object", "minProperties": "two"}},
                    {
                        "name": "remote",
                        "inputSchema": {"type": "object", "$ref": "https://example.com/s.json"},
                    },
                ]
            else:
                tools = [
                    {
                        "name": "count",
                        "description": "Count the words of a text.",
                        "inputSchema": {
                            "type": "object",
                            "properties": {"text": {"type": "string"}},
                            "required": ["text"],
                        },
                        "outputSchema": {
                            "type": "object",
                            "properties": {"words": {"type": "integer"}},
                            "required": ["words"],
                        },
                    }
                ]
            _send({"jsonrpc": "2.0", "id": mid, "result": {"tools": tools}})
        elif method == "tools/call":
            _send(
                {
                    "jsonrpc": "2.0",
                    "id": mid,
                    "result": {
                        "content": [{"type": "text", "text": "many"}],
                        "structuredContent": {"words": "many"},
                        "isError": False,
                    },
                }
            )
        else:
            _send({"jsonrpc": "2.0", "id": mid, "result": {}})


if __name__ == "__main__":
    kind = sys.argv[1]
    if kind == "raw":
        raw(sys.argv[2])
    else:
        # stdio takes an ignored tag (tests find their server processes by it)
        real(kind, int(sys.argv[2]) if kind == "http" else 0)
