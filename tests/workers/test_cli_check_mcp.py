"""``aiworker check`` on llm-agent steps that name MCP tools: an unknown server and a
tenant the server does not allow are caught before the run (with a servers file);
a malformed ``mcp:`` name always; a valid one passes. No server is started: whether
a server lists a tool is known only when the agent lists it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

AIWORKER = str(Path(sys.executable).parent / "aiworker")


def cli(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    return subprocess.run(
        [AIWORKER, *args],
        env={**base, "TEMPORAL_ADDRESS": "127.0.0.1:9", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def pipeline(tools: list[Any], tenant: str = "acme") -> dict[str, Any]:
    agent = {"id": "agent", "worker": "llm-agent", "input": {"prompt": "Go.", "tools": tools}}
    return {"name": "mcp-agent", "tenant": tenant, "steps": [agent]}


def test_check_names_an_unknown_server_and_a_tenant_it_does_not_allow(tmp_path: Path) -> None:
    servers = {
        "servers": {
            "calc": {"command": ["calc-server"], "tenants": ["acme"]},
            "search": {"url": "https://mcp.example.com/mcp"},
        }
    }
    (tmp_path / "mcp.json").write_text(json.dumps(servers))
    env = {"AIWORKER_MCP_SERVERS_FILE": str(tmp_path / "mcp.json")}
    f = tmp_path / "p.json"

    f.write_text(json.dumps(pipeline(["mcp:calc/add", "mcp:search/*", "validator"])))
    proc = cli(["check", str(f)], **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    f.write_text(json.dumps(pipeline(["mcp:calk/add", {"worker": "mcp:calc/*"}], "globex")))
    proc = cli(["check", str(f)], **env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        f"{f}: step 'agent': field 'input.tools[0]': unknown MCP server 'calk' "
        "(known: calc, search) (did you mean 'calc'?)",
        f"{f}: step 'agent': field 'input.tools[1]': tenant 'globex' may not use MCP "
        "server 'calc' (its 'tenants' in AIWORKER_MCP_SERVERS_FILE)",
    ]
    # without a servers file, a process checks no server (workers may have one)
    f.write_text(json.dumps(pipeline(["mcp:calk/add"])))
    assert cli(["check", str(f)]).returncode == 0


def test_a_malformed_mcp_name_is_refused_by_the_agents_input_schema(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps(pipeline(["mcp:Calc/add"])))
    proc = cli(["check", str(f)])
    assert proc.returncode == 2
    assert "input.tools[0]" in proc.stdout, proc.stdout
