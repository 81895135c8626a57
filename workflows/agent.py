"""``AgentWorkflow``: an ``llm-agent`` step, a model in a bounded loop with tools.

An activity cannot start activities, so the agent is a child workflow of the
pipeline (:func:`run_agent` starts it from the step runner): each model turn
is an ``llm-call`` activity (the transcript as ``messages``, the allowed
tools as ``tools``) and each tool call the tool worker's own activity through
:func:`~aiworker.workflows.calls.call_worker`, with its contract, retry
policy and an idempotency key ``<step key>/turn-<n>[/call-<i>]``. Every turn
and tool call is an entry in this workflow's history, so a worker process
killed mid-loop costs only the call in flight: on replay the finished ones
are read back, never run again.

The bounds, each checked before anything is scheduled: ``max_turns`` (model
calls), a tool's ``max_calls``, and the pipeline's budget share (tokens,
external calls) through the same :class:`~aiworker.workflows.budget.Ledger`
as a for_each chunk, plus the deadline (the step's admitted timeout and the
pipeline's, whichever comes first), which also cuts a call in flight.
Reaching one ends the step ``failed`` with ``budget_exceeded`` (the reason
names the bound) and the transcript so far in its outputs.

What the model gets wrong comes back to it as a tool error (a ``tool``
message with ``is_error``), counted, never a crash: a tool outside the
allow-list (``tool_not_allowed``), arguments that fail the tool's input
schema or are no JSON object (``invalid_input`` with the paths), a tool
worker's failure (its code and message). With ``response_schema`` a final
answer that misses it goes back to the model with the reasons, as one more
turn. The answer is the model's last text. Deterministic code only.

The specs it calls with (llm-call's, each tool's) are the ones its pipeline
recorded at its start (``AgentInput.specs``), never the catalog of the process
running it; an agent started without them is ``invalid_input``.

Tenant limits (``AgentInput.limits``, from the pipeline's run config): each
model turn and tool call is held to what a step calling that worker is. A
worker the tenant may not call (``llm-call``, or a tool, also one named by a
step's outputs) fails the step ``invalid_input`` before any turn. A call of a
rate-limited worker waits for its permit first, as a step's call does (this
workflow asks the limiter and receives the ``permit`` signal itself), until
the agent's deadline; a wait that reaches it ends the step ``rate_limited``
with the transcript so far. The step's concurrency key is the parent's lease,
held while the whole agent runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import messages, names, safe_schema
    from aiworker.schemas.agent import (
        MAX_TEXT_CHARS,
        MAX_TOOL_RESULT_CHARS,
        AgentInput,
        McpTool,
        Tool,
        agent_calls,
        allow_list,
        mcp_refs,
    )
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.limits import AcquireCall
    from aiworker.schemas.mcp import MCP_CALL
    from aiworker.schemas.pipeline import Budget, StepResult
    from aiworker.schemas.priority import task_priority
    from aiworker.schemas.spec import WorkerSpec
    from aiworker.schemas.tenants import refusal

from aiworker.workflows.budget import Admission, Deadline, Ledger
from aiworker.workflows.calls import CallContext, WorkerCall, call_worker, invalid_input
from aiworker.workflows.governed import Governance, Refused, governed_call
from aiworker.workflows.limits import CallLimits, PermitBook, PermitSignals

_BUDGET = ErrorCode.BUDGET_EXCEEDED.value


class _Stop(Exception):
    """A bound is reached: ``resource`` names it (caught in :meth:`Agent.run`)."""

    def __init__(self, resource: str, message: str, code: str = _BUDGET, **extra: Any) -> None:
        super().__init__(message)
        self.resource = resource
        self.message = message
        self.code = code
        self.extra = extra


@dataclass
class AgentState:
    """Where the loop stands: the transcript and the counts the result reports."""

    transcript: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    def outputs(self, stopped: str, answer: str | None, parsed: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "answer": answer,
            "stopped": stopped,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "calls": dict(self.calls),
            "errors": dict(self.errors),
            "transcript": list(self.transcript),
        }
        if parsed is not None:
            out["json"] = parsed
        return out


@workflow.defn(name=names.AGENT_WORKFLOW)
class AgentWorkflow(PermitSignals):
    """Runs one llm-agent step: model turns and tool calls, each an activity.

    It asks for the rate permits of its own calls, so the limiter's ``permit``
    and ``lease-check`` signals come to it (:class:`PermitSignals`)."""

    def __init__(self) -> None:
        self._state = AgentState()
        self._permits = PermitBook()

    @workflow.query(name=names.PROGRESS_QUERY)
    def progress(self) -> dict[str, Any]:
        """Turns and tool calls so far, and the limit a call waits for (if any)."""
        s = self._state
        return {
            "turns": s.turns,
            "tool_calls": s.tool_calls,
            "tool_errors": s.tool_errors,
            "waiting": self._permits.waiting_limits(),
        }

    @workflow.run
    async def run(self, req: AgentInput) -> StepResult:
        """The loop; every ending (answer, bound, failure) is a ``StepResult``."""
        if req.specs is None:
            # nothing to decide from: the process's catalog is never read in a workflow
            raise invalid_input(
                "agent: no recorded worker specs (AgentInput.specs); "
                "an agent runs as a pipeline's llm-agent step"
            )
        return await Agent(req, self._state, self._permits).run()


class Agent:
    """One run of the loop (the workflow's state lives in :class:`AgentState`)."""

    def __init__(
        self, req: AgentInput, state: AgentState, permits: PermitBook | None = None
    ) -> None:
        self.req = req
        self.state = state
        self.permits = permits
        # the workers whose calls wait for a rate permit (decided in run, from the input)
        self.rate_limited: frozenset[str] = frozenset()
        # what the pipeline recorded at its start (AgentWorkflow.run refuses none)
        self.specs: Mapping[str, WorkerSpec] = req.specs or {}
        self.llm = self.specs[names.LLM_CALL]
        a = req.allowance
        start = workflow.now().timestamp()
        ends = a.deadline
        if req.timeout_seconds is not None:
            own = start + req.timeout_seconds
            ends = own if ends is None else min(ends, own)
        self.ledger = Ledger(
            Budget(max_tokens=a.max_tokens, max_external_calls=a.max_external_calls),
            started_at=start,
            ends=Deadline(ends),
        )
        self.context = CallContext(
            tenant=req.tenant,
            trace_id=req.trace_id,
            step_id=req.step_id,
            queue_suffix=req.queue_suffix,
            priority=task_priority(workflow.info().priority, None, req.tenant),
        )
        self.tools: dict[str, Tool] = {}

    def _fail(
        self, code: str, message: str, reasons: list[dict[str, Any]] | None = None
    ) -> StepResult:
        return StepResult(
            status="failed",
            attempts=1,
            error_code=code,
            error_message=f"step {self.req.step_id!r}: {message}",
            reasons=reasons or [],
        )

    async def run(self) -> StepResult:
        spec = self.specs[names.LLM_AGENT]
        problems = messages.reasons(
            safe_schema.errors(safe_schema.validator(spec.input_schema), self.req.input)
        )
        if problems:
            first = problems[0]
            field_name = "input" + first["path"][1:]
            return self._fail(
                ErrorCode.INVALID_INPUT.value, f"field {field_name!r}: {first['message']}", problems
            )
        inp = self.req.input
        self.tools, bad = allow_list(inp["tools"], self.specs)
        if bad:
            return self._fail(ErrorCode.INVALID_INPUT.value, f"field {bad[0][0]!r}: {bad[0][1]}")
        refused = self._hold_to_tenant(inp["tools"])
        if refused is not None:
            return refused
        if inp.get("system"):
            self.state.transcript.append({"role": "system", "content": inp["system"]})
        self.state.transcript.append({"role": "user", "content": inp["prompt"]})
        try:
            failed = await self._list_mcp_tools(inp["tools"])
            if failed is not None:
                return failed.model_copy(update={"usage": self.ledger.used})
            result = await self.loop(int(inp.get("max_turns", 8)))
        except _Stop as stop:
            result = self._stopped(stop)
        return result.model_copy(update={"usage": self.ledger.used})

    async def _list_mcp_tools(self, tools: list[Any]) -> StepResult | None:
        """Add the MCP tools the step names (``mcp:<server>/<tool>``, ``/*``: all a server
        lists) to ``self.tools``, from one ``mcp-call`` listing per server: an activity,
        so the listing is recorded and replay decides from it. The step's failure
        when a listing fails (its code: ``invalid_input`` for an unknown server,
        ``access_denied`` for a tenant the server does not allow, ``timeout``...) or
        names a tool the server does not list; None when all is well."""
        refs, bad = mcp_refs(tools)
        if bad:
            return self._fail(ErrorCode.INVALID_INPUT.value, f"field {bad[0][0]!r}: {bad[0][1]}")
        if not refs:
            return None
        spec = self.specs.get(MCP_CALL)
        if spec is None:  # agent_specs adds it whenever a tool is an MCP one
            return self._fail(
                ErrorCode.INVALID_INPUT.value, f"this run has no {MCP_CALL!r} worker for MCP tools"
            )
        listed: dict[str, dict[str, McpTool]] = {}
        for ref in refs:
            if ref.server in listed:
                continue
            result = await self._call(
                spec,
                f"{self.req.key}/mcp-{ref.server}",
                {"op": "list_tools", "server": ref.server},
                f"list mcp:{ref.server}",
                None,
                lambda: None,
            )
            if not result.ok:
                return self._fail(
                    result.error_code or ErrorCode.INTERNAL.value,
                    f"field {ref.field!r}: listing the tools of MCP server {ref.server!r}: "
                    f"{result.error_message}",
                    result.reasons,
                )
            listed[ref.server] = {
                t["name"]: McpTool(
                    server=ref.server,
                    tool=t["name"],
                    description=t.get("description") or "",
                    input_schema=t["input_schema"],
                    output_schema=t.get("output_schema"),
                )
                for t in result.outputs.get("tools") or []
            }
        for ref in refs:
            offered = listed[ref.server]
            if ref.tool != "*" and ref.tool not in offered:
                names_ = ", ".join(sorted(offered)) or "none"
                return self._fail(
                    ErrorCode.INVALID_INPUT.value,
                    f"field {ref.field!r}: MCP server {ref.server!r} lists no tool "
                    f"{ref.tool!r} (it lists: {names_})",
                )
            for m in offered.values() if ref.tool == "*" else [offered[ref.tool]]:
                if m.name in self.tools:
                    if ref.tool == "*":
                        continue  # named on its own too, or by another wildcard
                    return self._fail(
                        ErrorCode.INVALID_INPUT.value,
                        f"field {ref.field!r}: tool {m.name!r} is listed twice",
                    )
                self.tools[m.name] = Tool(spec, ref.max_calls, m)
        return None

    def _hold_to_tenant(self, tools: list[Any]) -> StepResult | None:
        """Apply ``AgentInput.limits``: the step's failure when the tenant may not call
        llm-call or a tool (``invalid_input``, every one named), else None, with the
        workers whose calls wait for a permit set. An agent without limits asks nothing."""
        limits = self.req.limits
        if limits is None:
            return None
        allowed = limits.allowed
        refused = [
            (f, w) for f, w in agent_calls(tools) if allowed is not None and w not in allowed
        ]
        if not (refused or limits.rate_limited):
            return None
        if refused:
            turns = f" (each model turn of {names.LLM_AGENT!r} is a call of it)"
            problems = [
                {
                    "path": f,
                    "message": refusal(self.req.tenant, w) + (turns if f == "worker" else ""),
                    "worker": w,
                }
                for f, w in refused
            ]
            lines = "; ".join(f"field {p['path']!r}: {p['message']}" for p in problems)
            return self._fail(ErrorCode.INVALID_INPUT.value, lines, problems)
        self.rate_limited = frozenset(limits.rate_limited)
        return None

    def _asks(self, worker: WorkerSpec, what: str) -> list[AcquireCall]:
        """The permits a call of ``worker`` waits for: the tenant's rate permit when
        the run config says the worker is rate limited (tickets carry the call)."""
        if worker.worker_id not in self.rate_limited:
            return []
        me = workflow.info().workflow_id
        ticket = f"{me}/{what.replace(' ', '-')}/{workflow.uuid4().hex[:8]}"
        limits = CallLimits(
            requester=me, worker_id=worker.worker_id, tenant=self.req.tenant, rate_limited=True
        )
        return limits.calls(ticket, rate_suffix="/rate")

    def _stopped(self, stop: _Stop) -> StepResult:
        reasons = [{"resource": stop.resource, "message": stop.message, **stop.extra}]
        return self._fail(stop.code, stop.message, reasons).model_copy(
            update={"outputs": self.state.outputs(stop.resource, None)}
        )

    async def loop(self, max_turns: int) -> StepResult:
        inp, state = self.req.input, self.state
        definitions = [t.definition() for t in self.tools.values()]
        for turn in range(1, max_turns + 1):
            call: dict[str, Any] = {
                "messages": state.transcript,
                "model": inp.get("model", "default"),
                "tools": definitions,
            }
            for k in ("max_tokens", "temperature", "response_schema"):
                if k in inp:
                    call[k] = inp[k]

            def started(turn: int = turn) -> None:
                state.turns = turn

            result = await self._call(
                self.llm,
                f"{self.req.key}/turn-{turn}",
                call,
                f"turn {turn}",
                inp.get("turn_timeout_seconds"),
                started,
            )
            if not result.ok:
                if (
                    result.error_code == ErrorCode.INVALID_OUTPUT.value
                    and "response_schema" in inp
                    and result.reasons
                ):
                    state.transcript.append({"role": "user", "content": _rejected(result.reasons)})
                    continue
                return self._fail(
                    result.error_code or ErrorCode.INTERNAL.value,
                    f"turn {turn}: {result.error_message}",
                    result.reasons,
                ).model_copy(update={"outputs": state.outputs("error", None)})
            out = result.outputs
            text = str(out.get("text") or "")[:MAX_TEXT_CHARS]
            calls = list(out.get("tool_calls") or [])
            said: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                said["tool_calls"] = calls
            state.transcript.append(said)
            if not calls:
                return StepResult(
                    status="succeeded",
                    attempts=1,
                    outputs=state.outputs("answer", text, out.get("json")),
                )
            for i, tc in enumerate(calls):
                state.transcript.append(await self.tool_call(turn, i, tc))
        raise _Stop(
            "max_turns",
            f"{max_turns} turns (max_turns) passed without a final answer",
            limit=max_turns,
        )

    async def tool_call(self, turn: int, index: int, tc: dict[str, Any]) -> dict[str, Any]:
        """Run one tool call the model asked for; its ``tool`` message (an error one
        when the call is not allowed, its arguments are wrong or the tool failed)."""
        state = self.state
        state.tool_calls += 1
        name, args = str(tc.get("name")), tc.get("arguments")
        reply = {"role": "tool", "tool_call_id": str(tc.get("id")), "name": name}
        tool = self.tools.get(name)
        if tool is None:
            allowed = ", ".join(self.tools)
            return self._tool_error(
                reply,
                ErrorCode.TOOL_NOT_ALLOWED.value,
                f"tool {name!r} is not allowed; the allowed tools are: {allowed}",
            )
        if not isinstance(args, dict):
            return self._tool_error(
                reply,
                ErrorCode.INVALID_INPUT.value,
                f"the arguments of {name!r} must be a JSON object, got {_got(args)}",
            )
        problems = messages.reasons(
            safe_schema.errors(safe_schema.validator(tool.input_schema), args)
        )
        if problems:
            detail = "; ".join(f"{p['path']}: {p['message']}" for p in problems[:5])
            return self._tool_error(
                reply,
                ErrorCode.INVALID_INPUT.value,
                f"the arguments of {name!r} fail its input schema: {detail}",
            )
        made = state.calls.get(name, 0)
        if tool.max_calls is not None and made >= tool.max_calls:
            raise _Stop(
                "max_calls",
                f"tool {name!r} was called {made} times (its max_calls) and the model "
                "asked for another",
                tool=name,
                limit=tool.max_calls,
            )
        key = f"{self.req.key}/turn-{turn}/call-{index}"

        def started() -> None:
            state.calls[name] = made + 1

        call_input: dict[str, Any] = args
        if tool.mcp is not None:
            m = tool.mcp
            call_input = {"op": "call_tool", "server": m.server, "tool": m.tool, "arguments": args}
            if m.output_schema is not None:
                call_input["output_schema"] = m.output_schema
        result = await self._call(tool.spec, key, call_input, f"turn {turn} {name}", None, started)
        if not result.ok:
            return self._tool_error(
                reply, result.error_code or ErrorCode.INTERNAL.value, result.error_message or ""
            )
        body = {"status": result.status, "outputs": result.outputs}
        return {
            **reply,
            "content": _bounded(json.dumps(body, ensure_ascii=False)),
            "is_error": tool.mcp is not None and bool(result.outputs.get("is_error")),
        }

    def _tool_error(self, reply: dict[str, Any], code: str, message: str) -> dict[str, Any]:
        self.state.tool_errors += 1
        self.state.errors[code] = self.state.errors.get(code, 0) + 1
        content = json.dumps({"error": {"code": code, "message": message}}, ensure_ascii=False)
        return {**reply, "content": _bounded(content), "is_error": True}

    async def _call(
        self,
        worker: WorkerSpec,
        key: str,
        call_input: dict[str, Any],
        what: str,
        turn_timeout: float | None,
        started: Callable[[], None],
    ) -> StepResult:
        """One activity through :func:`~aiworker.workflows.governed.governed_call`:
        its rate permit first when the worker is rate limited for the tenant (waited
        for until the deadline, as a step's call waits), then admitted by the agent's
        ledger (a refusal is a bound), cut at the deadline, its usage booked either
        way. ``started`` counts the call once admitted."""
        req = self.req
        call = WorkerCall(
            worker,
            key=key,
            input=call_input,
            context=self.context,
            summary=f"{req.step_id} {what}",
            timeout_seconds=turn_timeout,
        )

        async def invoke(admission: Admission | None) -> StepResult:
            started()
            return await call_worker(call, admission)

        gov = Governance(
            ledger=self.ledger,
            permits=self.permits,
            asks=lambda: self._asks(worker, what),
            deadline=self.ledger.ends,
            who=req.step_id,
            cut=True,
        )
        result = await governed_call(call, gov, invoke)
        if isinstance(result, Refused):
            if result.kind == "rate_limited":
                raise _Stop(
                    "rate_limited",
                    f"{what} ({worker.worker_id}) waited for the tenant's rate limit until "
                    "the step's deadline passed",
                    code=ErrorCode.RATE_LIMITED.value,
                    worker=worker.worker_id,
                )
            if result.kind == "deadline":
                raise _Stop("deadline", f"the step's deadline passed during {what}")
            msg = "the step's deadline has passed" if result.resource == "deadline" else None
            raise _Stop(result.resource, f"{msg or result.message} (before {worker.worker_id})")
        return result


def _rejected(reasons: list[dict[str, Any]]) -> str:
    lines = "\n".join(f"- {r.get('path', '$')}: {r.get('message', r)}" for r in reasons[:20])
    return (
        "Your answer was rejected: it does not match the required JSON Schema. "
        "Answer again and fix every one of these:\n" + lines
    )


def _bounded(text: str) -> str:
    if len(text) <= MAX_TOOL_RESULT_CHARS:
        return text
    cut = len(text) - MAX_TOOL_RESULT_CHARS
    return text[:MAX_TOOL_RESULT_CHARS] + f"... [{cut} more characters cut]"


def _got(value: Any) -> str:
    # arguments the model sent as text are text that is not JSON (else decoded)
    return "text that is not JSON" if isinstance(value, str) else messages.type_name(value)


__all__ = ["AgentWorkflow"]
