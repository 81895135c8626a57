"""The workflow helper modules shared with the sandbox (``SHARED_WORKFLOW_MODULES``).

Passing a module through saves re-importing it for every workflow run; it is
safe only for modules that keep no state a run could change, and the sandbox
must go on checking the code it still imports per run (each workflow's own
module).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pkgutil
import sys
import types
import typing
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from sandbox_probe import ClockProbeWorkflow
from support.waiting import wait_until
from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.workflow import _Definition

import aiworker.workflows
from aiworker.config.settings import Settings
from aiworker.workers.process.plugin import (
    SHARED_WORKFLOW_MODULES,
    OwnWorkflowsRunner,
    with_shared_modules,
    workflow_runner,
)
from aiworker.workers.process.replay import aiworker_workflows
from aiworker.workflows.pipeline import PipelineWorkflow

_IMMUTABLE = (str, bytes, int, float, bool, Decimal, type(None), frozenset, enum.Enum, timedelta)
# limits defines LimiterWorkflow, yet is shared: its PermitSignals mixin and permit
# book must be the same classes for the pipeline, the chunks and the limiter.
_SHARED_DESPITE_WORKFLOW = {"aiworker.workflows.limits"}


def _immutable(value: object) -> bool:
    if isinstance(value, tuple):
        # a tuple of classes (the exception types an ``except`` catches) is shared as
        # the module's own classes are (left out of _module_data)
        return all(isinstance(v, type) or _immutable(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # a frozen dataclass of immutable fields (a constant like NO_DEADLINE)
        frozen = type(value).__dataclass_params__.frozen  # type: ignore[attr-defined]
        return frozen and all(_immutable(getattr(value, f.name)) for f in dataclasses.fields(value))
    return isinstance(value, _IMMUTABLE)


def _from_schemas(name: str, value: object) -> bool:
    """A value imported from ``aiworker.schemas`` (shared with every run already:
    the workflows import the contracts passed through)."""
    return any(
        getattr(m, name, None) is value
        for key, m in list(sys.modules.items())
        if key.startswith("aiworker.schemas.")
    )


def _module_data(module: types.ModuleType) -> dict[str, object]:
    """The module's own values: no functions, classes, modules, type aliases, or
    values imported from the contracts."""
    out = {}
    for name, value in vars(module).items():
        # ``annotations`` is the ``from __future__`` flag, not data
        if name.startswith("__") or name == "annotations":
            continue
        if inspect.ismodule(value) or callable(value):
            continue
        if _from_schemas(name, value):
            continue
        if isinstance(value, (types.GenericAlias, typing.TypeVar)) or typing.get_origin(value):
            continue
        out[name] = value
    return out


def _defines_workflow(module: types.ModuleType) -> bool:
    return any(
        _Definition.from_class(v) is not None and v.__module__ == module.__name__
        for v in vars(module).values()
        if isinstance(v, type)
    )


def _workflow_modules() -> list[types.ModuleType]:
    return [
        importlib.import_module(f"aiworker.workflows.{m.name}")
        for m in pkgutil.iter_modules(aiworker.workflows.__path__)
    ]


def test_workflow_modules_keep_no_mutable_state() -> None:
    """Every module of aiworker.workflows, not only the shared ones: unsandboxed
    (OwnWorkflowsRunner), every run of a process uses the same module objects."""
    names_ = sorted({*SHARED_WORKFLOW_MODULES, *(m.__name__ for m in _workflow_modules())})
    assert set(SHARED_WORKFLOW_MODULES) < set(names_)
    mutable = {
        f"{name}.{key}": type(value).__name__
        for name in names_
        for key, value in _module_data(importlib.import_module(name)).items()
        if not _immutable(value)
    }
    assert mutable == {}, "module-level values a run could change, shared by every run"


def test_workflow_modules_stay_sandboxed_and_helpers_are_shared() -> None:
    modules = _workflow_modules()
    with_workflows = {m.__name__ for m in modules if _defines_workflow(m)}
    helpers = {m.__name__ for m in modules if not _defines_workflow(m)} - {"aiworker.workflows"}
    assert {"aiworker.workflows.pipeline", "aiworker.workflows.foreach"} <= with_workflows
    # each run re-imports its own workflow's module: the sandbox checks that code
    assert set(SHARED_WORKFLOW_MODULES) & with_workflows == _SHARED_DESPITE_WORKFLOW
    # a helper left out is imported again (compiled, its dataclasses rebuilt) every run
    assert helpers - set(SHARED_WORKFLOW_MODULES) == set()


async def test_the_sandbox_still_refuses_a_clock_read(client: Client) -> None:
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=queue, workflows=[ClockProbeWorkflow], workflow_runner=workflow_runner()
    ):
        handle = await client.start_workflow(
            ClockProbeWorkflow.run, id=f"clock-{uuid.uuid4().hex[:8]}", task_queue=queue
        )

        async def task_failure() -> str:
            async for event in handle.fetch_history_events():
                if event.HasField("workflow_task_failed_event_attributes"):
                    return event.workflow_task_failed_event_attributes.failure.message
            return ""

        message = await wait_until(task_failure, "the clock read to fail its workflow task")
        await handle.terminate()
    assert "datetime.datetime.now" in message
    assert "Cannot access" in message


def test_aiworkers_own_workflows_run_unsandboxed_and_every_other_sandboxed() -> None:
    """OwnWorkflowsRunner: aiworker's workflows skip the sandbox (their histories are
    replayed in the SDK's default sandbox by tests/workflows/test_replay.py instead);
    a user's workflow beside them keeps it; AIWORKER_WORKFLOW_SANDBOX sandboxes all."""
    own = [_Definition.must_from_class(c) for c in aiworker_workflows()]
    probe = _Definition.must_from_class(ClockProbeWorkflow)
    default, everything = workflow_runner(), workflow_runner(sandbox_own=True)
    assert [d.name for d in own if default.sandboxes(d)] == []
    assert default.sandboxes(probe)
    assert all(everything.sandboxes(d) for d in [*own, probe])


def test_the_workflow_sandbox_setting_reaches_the_plugins_runner(tmp_path: Path) -> None:
    pipeline = _Definition.must_from_class(PipelineWorkflow)
    for env, sandboxed in (({"AIWORKER_WORKFLOW_SANDBOX": "true"}, True), ({}, False)):
        settings = Settings.from_env({"AIWORKER_DATA_DIR": str(tmp_path), **env})
        assert settings.workflow_sandbox is sandboxed
        runner = with_shared_modules(None, settings.workflow_sandbox)
        assert isinstance(runner, OwnWorkflowsRunner)
        assert runner.sandboxes(pipeline) is sandboxed
