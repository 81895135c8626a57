"""The ``mcp-call`` worker: one listing or one tool call of an MCP server.

What ``llm-agent`` runs for its MCP tools (``mcp:<server>/<tool>``,
:mod:`aiworker.schemas.mcp`): ``{"op": "list_tools", "server"}`` answers the
server's tools with their schemas (recorded in the agent's history, which
decides from that record), ``{"op": "call_tool", "server", "tool",
"arguments", "output_schema"?}`` answers the tool's ``text``, ``structured``
content and ``is_error``. Each is an activity with this spec's timeout and
retries, its call counted as one external call, through the ``mcp`` tool
(:class:`~aiworker.activities.tools.mcp.McpClient`), which holds the servers
file, the tenant check, the egress guard and every bound.

It needs the ``llm`` extra (the ``mcp`` package). It is not a built-in with an
extra: it shares the ``aiworker-llm`` queue with ``llm-call``, which a core
install serves, so a process without the extra serves it anyway and each call
fails ``invalid_input`` with the ``pip install`` line to type.
"""

from __future__ import annotations

from typing import Any

from aiworker.activities.errors import InvalidInputError
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.config.catalog import builtin_spec
from aiworker.config.extras import MissingExtraError, installed


class McpCall(Worker):
    """Lists or calls the tools of an MCP server named in the servers file."""

    spec = builtin_spec("mcp-call")

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        if not installed("llm"):
            raise InvalidInputError(str(MissingExtraError(self.worker_id, "llm")))
        from aiworker.activities.tools.mcp import McpClient

        client: McpClient = ctx.tools.use("mcp")
        server = input["server"]
        fields = {"server": server, "tool": input.get("tool")}
        if input["op"] == "list_tools":
            tools = await client.list_tools(server, ctx.tenant)
            return WorkerResult(outputs={"server": server, "tools": tools}, log_fields=fields)
        out = await client.call_tool(
            server,
            ctx.tenant,
            input["tool"],
            input["arguments"],
            input.get("output_schema"),
        )
        return WorkerResult(outputs={"server": server, **out}, log_fields=fields)
