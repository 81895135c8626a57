"""MCP servers as ``llm-agent`` tools: the servers file and the tool names.

An agent's ``tools`` may name a tool of a Model Context Protocol server as
``mcp:<server>/<tool>``, or every tool it lists as ``mcp:<server>/*``. The
servers are declared in the JSON file ``AIWORKER_MCP_SERVERS_FILE``::

    {"servers": {
        "files": {"command": ["python", "-m", "my_mcp_server"], "tenants": ["acme"]},
        "search": {"url": "https://mcp.example.com/mcp", "timeout_seconds": 20}
    }}

``command`` (an argv list, run without a shell) starts a stdio server;
``url`` names a streamable-HTTP server (reached through the egress guard).
``tenants`` lists the tenants that may use the server (absent: every tenant).
Both kinds are called by the ``mcp-call`` worker (``activities/mcp_call.py``),
one activity per listing and per tool call; ``workflows/agent.py`` decides from
the recorded listing. Pure except :func:`load_mcp_servers`, which reads a file.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, model_validator

from aiworker.schemas.base import Model
from aiworker.schemas.files import load_json_model
from aiworker.schemas.names import TENANT_PATTERN

MCP_PREFIX = "mcp:"
# The worker that lists and calls MCP tools (one activity each).
MCP_CALL = "mcp-call"
SERVER_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
# What MCP allows a tool name to be (1-128 of these characters).
TOOL_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
# The `tools` item of an llm-agent input that names MCP tools.
TOOL_REF_PATTERN = r"^mcp:[a-z0-9][a-z0-9_-]{0,31}/(\*|[A-Za-z0-9_.-]{1,128})$"
_TOOL_REF = re.compile(TOOL_REF_PATTERN)
MAX_SERVERS = 100
MAX_FILE_BYTES = 1_000_000
# Bounds of what one server may send: the largest JSON-RPC message (a tool list
# or a tool result), the most tools one listing may hold.
DEFAULT_MAX_RESPONSE_BYTES = 1_000_000
MAX_TOOLS = 128
# OpenAI function names: ^[a-zA-Z0-9_-]{1,64}$ (Anthropic's are the same set).
_MODEL_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_MODEL_NAME_MAX = 64


class McpServersFileError(ValueError):
    """``AIWORKER_MCP_SERVERS_FILE`` cannot be read or is not valid; names the field."""


ServerName = Annotated[str, Field(pattern=SERVER_PATTERN)]


class McpServer(Model):
    """One server of the servers file: how to reach it and who may use it."""

    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="a stdio server: the argv to start it (no shell)",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables added for a stdio server"
    )
    url: Annotated[str, Field(pattern=r"^https?://", max_length=2048)] | None = Field(
        default=None, description="a streamable-HTTP server: its MCP endpoint"
    )
    tenants: list[Annotated[str, Field(pattern=TENANT_PATTERN)]] | None = Field(
        default=None, description="the tenants that may use it (absent: every tenant)"
    )
    timeout_seconds: float = Field(
        default=30,
        gt=0,
        le=55,
        description=(
            "the bound of connecting, listing and one tool call together (at most 55 s: "
            "the mcp-call worker's own 60 s timeout, which worker pods' drain outlasts, "
            "must end after it)"
        ),
    )
    max_response_bytes: int = Field(
        default=DEFAULT_MAX_RESPONSE_BYTES,
        ge=1024,
        le=64_000_000,
        description="the largest message (tool list, tool result) read from the server",
    )

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("a server has exactly one of 'command' (stdio) and 'url' (HTTP)")
        if self.env and self.command is None:
            raise ValueError("'env' is for a stdio server ('command')")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def allows(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


class McpServersFile(Model):
    """The servers file: every MCP server there is, by name."""

    servers: dict[ServerName, McpServer] = Field(max_length=MAX_SERVERS)


def load_mcp_servers(path: Path) -> McpServersFile:
    """Read and check a servers file; ``McpServersFileError`` names the file and field."""
    return load_json_model(path, MAX_FILE_BYTES, McpServersFile, McpServersFileError)


def is_mcp_ref(name: Any) -> bool:
    """Whether a ``tools`` entry (a name) is meant as an MCP tool (starts ``mcp:``)."""
    return isinstance(name, str) and name.startswith(MCP_PREFIX)


def parse_ref(name: str) -> tuple[str, str] | None:
    """``(server, tool)`` of ``mcp:<server>/<tool>`` (tool ``*``: all), None if malformed."""
    m = _TOOL_REF.match(name)
    if m is None:
        return None
    server, _, tool = name[len(MCP_PREFIX) :].partition("/")
    return server, tool


def ref_problem(name: str) -> str | None:
    """Why ``name`` is not a valid MCP tool reference (None: it is)."""
    if parse_ref(name) is not None:
        return None
    return (
        f"{name!r} is not an MCP tool: write mcp:<server>/<tool> or mcp:<server>/* "
        "(server: lower-case letters, digits, '-' and '_')"
    )


def tool_worker(name: str) -> str:
    """The worker a ``tools`` entry calls: ``mcp-call`` for an MCP tool, else itself."""
    return MCP_CALL if is_mcp_ref(name) else name


def model_name(server: str, tool: str) -> str:
    """The function name the model sees for an MCP tool: ``mcp__<server>__<tool>``,
    made of the characters providers accept, at most 64 (a long one ends in a hash)."""
    name = _MODEL_NAME_CHARS.sub("_", f"mcp__{server}__{tool}")
    if len(name) <= _MODEL_NAME_MAX:
        return name
    digest = hashlib.sha256(f"{server}/{tool}".encode()).hexdigest()[:8]
    return f"{name[: _MODEL_NAME_MAX - 9]}_{digest}"


__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "MAX_TOOLS",
    "MCP_CALL",
    "MCP_PREFIX",
    "TOOL_REF_PATTERN",
    "McpServer",
    "McpServersFile",
    "McpServersFileError",
    "is_mcp_ref",
    "load_mcp_servers",
    "model_name",
    "parse_ref",
    "ref_problem",
    "tool_worker",
]
