"""Which worker specs a pipeline run records at its start.

A run decides from worker specs (task queue, timeout, retries, ``execution``,
input and output schemas) for the rest of its life, also when it is replayed
on a process whose catalog has changed since (a deploy changed a spec, or
dropped a worker). So it records them once, in the ``run-config`` local
activity's result (``RunConfig.specs``) that every pipeline already waits for at
its start, and never reads the process's catalog again. Only the specs the
run names are recorded, each without its ``examples``
(:func:`~aiworker.schemas.spec.recorded`), to keep the history small.

:func:`named_workers` lists them: every step's worker and fallback, the
``validator`` when a step validates its output, and for an ``llm-agent``
step ``llm-call`` (each model turn) and the workers its input names as
``tools`` (literal names, or references to the pipeline's ``inputs``).
A tool list that refers to a step's outputs is not known at the start: such a
run records every worker the answering process knows (:func:`open_tools`,
``RunConfigCall.record_all``), the one case where the record is not the names
alone. Pure: safe inside a workflow task.
"""

from __future__ import annotations

from typing import Any

from aiworker.schemas import names
from aiworker.schemas.mcp import tool_worker
from aiworker.schemas.pipeline import PipelineSpec
from aiworker.schemas.refs import ReferenceError_, resolve


def agent_tools(tools: Any, inputs: dict[str, Any]) -> tuple[list[str], bool]:
    """The worker ids an llm-agent input's ``tools`` names, with references to the
    pipeline's ``inputs`` resolved, and whether that is all of them (False when a
    part refers to a step's outputs, known only when the step runs)."""
    try:
        return _names(resolve(tools, {"inputs": inputs})), True
    except ReferenceError_:
        pass
    if not isinstance(tools, list):
        return [], False
    known = []
    for item in tools:
        try:
            known.append(resolve(item, {"inputs": inputs}))
        except ReferenceError_:
            continue
    return _names(known), False


def _names(tools: Any) -> list[str]:
    out = []
    for item in tools if isinstance(tools, list) else []:
        wid = item.get("worker") if isinstance(item, dict) else item
        if isinstance(wid, str):
            out.append(tool_worker(wid))
    return out


def named_workers(spec: PipelineSpec) -> list[str]:
    """Every worker whose spec a run of ``spec`` may call, sorted, each once."""
    found: set[str] = set()
    for step in spec.steps:
        if step.wait is None:
            found.add(step.worker)
        if step.fallback is not None:
            found.add(step.fallback)
        if step.validate_ is not None:
            found.add(names.VALIDATOR)
        if step.worker == names.LLM_AGENT:
            found.add(names.LLM_CALL)
            if isinstance(step.input, dict):
                found.update(agent_tools(step.input.get("tools"), spec.inputs)[0])
    return sorted(found)


def open_tools(spec: PipelineSpec) -> bool:
    """Whether an llm-agent step of ``spec`` names tools only its run can know
    (a reference to a step's outputs): then the run records every known worker."""
    return any(
        step.worker == names.LLM_AGENT
        and isinstance(step.input, dict)
        and not agent_tools(step.input.get("tools"), spec.inputs)[1]
        for step in spec.steps
    )


__all__ = ["agent_tools", "named_workers", "open_tools"]
