"""The ``llm-agent`` step's contract with its child workflow, and its tools.

A step whose worker is ``llm-agent`` runs as ``AgentWorkflow``
(``workflows/agent.py``): the pipeline admits it once through its budget and
hands the child an :class:`AgentInput` (the resolved step input, the
idempotency key of the call, and the admission as an allowance with the
deadline). The child's tools are worker specs: :func:`tool_definition` turns
one into what the model sees (name = worker id, description = purpose,
parameters = input schema), :func:`allow_list` reads the step's ``tools``.
Pure: no I/O, safe inside a workflow task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from aiworker.schemas.base import Model
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.mcp import is_mcp_ref, model_name, parse_ref, ref_problem, tool_worker
from aiworker.schemas.names import LLM_CALL, TENANT_PATTERN
from aiworker.schemas.pipeline import ChunkAllowance, StepResult
from aiworker.schemas.refs import ReferenceError_, resolve
from aiworker.schemas.spec import RecordedSpec, WorkerSpec

# What the model sees of one tool result; the rest is cut with a note, so the
# transcript (sent again every turn, and kept in history) stays bounded.
MAX_TOOL_RESULT_CHARS = 8000
# The model's own words per message in the transcript (its reply is bounded by
# max_tokens anyway; this guards a provider that ignores it).
MAX_TEXT_CHARS = 32000
# The bounds that are the step's own: reaching one fails the step, not the
# pipeline's budget (tokens, external calls and the deadline are the pipeline's).
STEP_BOUNDS = ("max_turns", "max_calls")


class AgentLimits(Model):
    """What the pipeline's run config says of the workers an agent calls, so that
    each model turn and tool call is held to what a step calling that worker is:
    ``rate_limited`` the workers (llm-call, tools) whose calls wait for the
    tenant's rate permit, ``allowed`` the tenant's worker list (None: all)."""

    rate_limited: list[str] = Field(
        default_factory=list,
        description="workers whose calls ask the limiter for a permit first",
    )
    allowed: list[str] | None = Field(
        default=None, description="the workers the tenant may call (None: no list)"
    )


class AgentInput(Model):
    """The input of ``AgentWorkflow``: one llm-agent call of a pipeline step."""

    step_id: str
    key: str = Field(description="the call's idempotency key; turn n is <key>/turn-<n>")
    tenant: str = Field(pattern=TENANT_PATTERN)
    trace_id: str
    queue_suffix: str = ""
    input: dict[str, Any] = Field(description="the step's resolved input")
    allowance: ChunkAllowance = Field(default_factory=ChunkAllowance)
    timeout_seconds: float | None = Field(
        default=None, description="the hard stop: no turn or tool call starts after it"
    )
    specs: dict[str, RecordedSpec] | None = Field(
        default=None,
        description="the specs the pipeline recorded that the agent uses: llm-agent's, "
        "llm-call's (each turn) and its tools' (None: refused as invalid_input; an agent "
        "never reads a catalog)",
    )
    limits: AgentLimits | None = Field(
        default=None,
        description="the tenant's rate limits and worker list for the agent's calls (None: "
        "none; its calls ask no permits)",
    )


@dataclass(frozen=True)
class McpTool:
    """An MCP server's tool as its recorded listing (``mcp-call``'s ``list_tools``)
    describes it."""

    server: str
    tool: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        """The function name the model sees (:func:`~aiworker.schemas.mcp.model_name`)."""
        return model_name(self.server, self.tool)


@dataclass(frozen=True)
class Tool:
    """One allowed tool: its worker's spec and how often the model may call it;
    for an MCP tool, ``spec`` is ``mcp-call``'s and ``mcp`` the tool as listed."""

    spec: WorkerSpec
    max_calls: int | None
    mcp: McpTool | None = None

    @property
    def input_schema(self) -> dict[str, Any]:
        """What the model's arguments must match."""
        return self.mcp.input_schema if self.mcp is not None else self.spec.input_schema

    def definition(self) -> dict[str, Any]:
        """What the model sees of this tool (llm-call's ``tools`` item)."""
        if self.mcp is None:
            return tool_definition(self.spec)
        m = self.mcp
        params = {k: v for k, v in m.input_schema.items() if k not in ("$schema", "$id")}
        about = f"{m.description} (tool {m.tool!r} of MCP server {m.server!r})".strip()
        return {"name": m.name, "description": about, "parameters": params}


@dataclass(frozen=True)
class McpRef:
    """An MCP entry of an agent's ``tools``: ``mcp:<server>/<tool>`` (tool ``*``: all)."""

    field: str
    server: str
    tool: str
    max_calls: int | None


def mcp_refs(tools: list[Any]) -> tuple[list[McpRef], list[tuple[str, str]]]:
    """The step's MCP tools (``mcp:...`` entries), and the problems of malformed ones."""
    out: list[McpRef] = []
    problems: list[tuple[str, str]] = []
    for i, item in enumerate(tools):
        wid = item if isinstance(item, str) else item.get("worker")
        if not is_mcp_ref(wid):
            continue
        field = f"input.tools[{i}]"
        parsed = parse_ref(wid)
        if parsed is None:
            problems.append((field, ref_problem(wid) or ""))
            continue
        max_calls = None if isinstance(item, str) else item.get("max_calls")
        out.append(McpRef(field, parsed[0], parsed[1], max_calls))
    return out, problems


def tool_definition(spec: WorkerSpec) -> dict[str, Any]:
    """What the model sees of a worker (llm-call's ``tools`` item)."""
    params = {k: v for k, v in spec.input_schema.items() if k not in ("$schema", "$id")}
    return {"name": spec.worker_id, "description": spec.purpose, "parameters": params}


def allow_list(
    tools: list[Any], specs: Mapping[str, WorkerSpec]
) -> tuple[dict[str, Tool], list[tuple[str, str]]]:
    """The step's ``tools`` as worker id -> :class:`Tool`, and the problems found
    (``(field, message)``: an unknown worker, an agent, a tool named twice)."""
    out: dict[str, Tool] = {}
    problems: list[tuple[str, str]] = []
    for i, item in enumerate(tools):
        field = f"input.tools[{i}]"
        wid = item if isinstance(item, str) else item.get("worker")
        max_calls = None if isinstance(item, str) else item.get("max_calls")
        if is_mcp_ref(wid):  # an MCP tool: mcp_refs reads it, the agent lists it
            if (problem := ref_problem(wid)) is not None:
                problems.append((field, problem))
            continue
        spec = specs.get(wid) if isinstance(wid, str) else None
        if spec is None:
            known = ", ".join(sorted(k for k, s in specs.items() if s.kind != "workflow"))
            problems.append((field, f"unknown worker {wid!r} (known: {known})"))
        elif spec.kind == "workflow":
            problems.append((field, f"{wid!r} runs as a workflow and cannot be a tool"))
        elif wid in out:
            problems.append((field, f"tool {wid!r} is listed twice"))
        else:
            out[wid] = Tool(spec, max_calls)
    return out, problems


def agent_calls(tools: Any, inputs: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """``(field, worker id)`` of each worker an llm-agent step with ``tools`` calls
    besides itself: ``llm-call`` for its model turns (field ``worker``) and each tool
    it names (``input.tools[<i>]``). References to the pipeline's ``inputs`` are
    resolved when ``inputs`` is given; a part that refers to a step's outputs is
    left out (known only when the agent runs, which checks it then)."""
    out = [("worker", LLM_CALL)]
    scope = {"inputs": dict(inputs or {})}
    try:
        tools = resolve(tools, scope)
    except ReferenceError_:
        pass
    for i, item in enumerate(tools if isinstance(tools, list) else []):
        try:
            item = resolve(item, scope)
        except ReferenceError_:
            continue
        wid = item.get("worker") if isinstance(item, dict) else item
        if isinstance(wid, str) and "${{" not in wid:
            out.append((f"input.tools[{i}]", tool_worker(wid)))
    return out


def agent_specs(
    agent: WorkerSpec, step_input: dict[str, Any], specs: Mapping[str, WorkerSpec]
) -> dict[str, WorkerSpec]:
    """What an agent child needs of the run's ``specs``: the agent's own, llm-call's
    (each turn) and those of the tools its resolved input names; a tool the run
    does not have is left out (the agent refuses it as an unknown worker)."""
    tools = step_input.get("tools") if isinstance(step_input, dict) else None
    wanted = {LLM_CALL}
    for item in tools if isinstance(tools, list) else []:
        wid = item.get("worker") if isinstance(item, dict) else item
        if isinstance(wid, str):
            wanted.add(tool_worker(wid))
    out = {agent.worker_id: agent}
    out.update({w: specs[w] for w in sorted(wanted) if w in specs})
    return out


def ends_pipeline(result: StepResult) -> bool:
    """Whether a step's ``budget_exceeded`` spent the pipeline's budget (tokens,
    external calls, its deadline) rather than a bound of an agent's own."""
    if result.error_code != ErrorCode.BUDGET_EXCEEDED.value:
        return False
    first = result.reasons[0] if result.reasons else {}
    return first.get("resource") not in STEP_BOUNDS
