"""``AiworkerPlugin``: aiworker's workflows and activities on a user's own Temporal worker.

A team with its own Temporal workers adds aiworker to them with the SDK's plugin
convention (``temporalio.plugin.SimplePlugin``, as the OpenAI Agents and Pydantic
AI integrations ship theirs) instead of copying ``workers/process/worker.py``'s wiring::

    plugin = AiworkerPlugin(settings)                      # the pipelines queue
    client = await Client.connect("localhost:7233", plugins=[plugin])
    worker = Worker(client, task_queue=plugin.task_queue, workflows=[MyWorkflow])

The plugin brings, for one aiworker base queue (``queue``, the pipelines queue
unless told): that queue's workflows and activities (the workers ``workers``
names, the built-ins when omitted), aiworker's data converter (on a ``Client``),
the sandbox pass-throughs of its shared workflow modules and the call-telemetry
activity interceptor, and the exception types that fail aiworker's workflows
(:data:`WORKFLOW_FAILURE_TYPES`: its domain errors only). Every parameter
appends to, or wraps, what the user set: their own workflows, activities and
interceptors stay, and their sandbox restrictions gain aiworker's
pass-throughs. The user's Worker must poll :attr:`AiworkerPlugin.task_queue`
(aiworker's workflows start there).

An exception of any other type raised in aiworker's workflow code is a bug: it
fails the *workflow task*, not the run, so the run waits with everything it
has done in its history until a fixed build picks it up (docs/operations.md).
A user's Worker that lists a broad type (``Exception``) in its own
``workflow_failure_exception_types`` turns those bugs back into failed runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from temporalio import workflow
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    UnsandboxedWorkflowRunner,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from aiworker.activities.runtime import WorkerRuntime
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.process.worker_set import WorkerSet, builtin_set

PLUGIN_NAME = "aiworker.AiworkerPlugin"

WORKFLOW_FAILURE_TYPES: tuple[type[BaseException], ...] = (ApplicationError,)
"""What fails an aiworker workflow execution rather than its workflow task: its
domain outcomes and bad input, each an ``ApplicationError`` whose ``type`` is a
stable error code (``aiworker.schemas.errors``). The SDK fails the execution on
any ``FailureError`` already; the list names the domain errors (as pydantic-ai's
``PydanticAIPlugin`` names its own) and, as much, says that nothing else does:
a ``TypeError`` or ``KeyError`` in workflow code is a bug, whose workflow task
fails and is retried until a build with the fix takes the run over."""


# When aiworker's workflows run sandboxed (AIWORKER_WORKFLOW_SANDBOX=true, the replay
# tests; OwnWorkflowsRunner below runs them unsandboxed otherwise), the workflows'
# helper modules are shared with the sandbox instead of being re-imported (and their
# dataclasses rebuilt) for every workflow run: that import was about a third of a short
# pipeline's worker CPU. Temporal's guidance is to pass through every module whose calls
# are deterministic. Safe because each of these modules (a) keeps no module state a run
# could change: only constants, functions and classes, whose instances live in the run's
# own objects (tests/workers/test_sandbox_modules.py checks every module-level value is
# immutable), and (b) follows the sandbox rules like any workflow code (the replay tests
# run them in the SDK's default sandbox, which passes none of them through). The modules
# that define the workflows the SDK loads per run (pipeline, foreach, agent, breakers,
# conformance, flow) are not shared: each run re-imports its own workflow module, so the
# sandbox still checks that code and isolates its state. pipeline_body is
# PipelineWorkflow's handlers and run, moved out of pipeline.py (which keeps the class
# and its @workflow.run): the per-run import of the module with them, each handler's
# decorator resolving its type hints, took 8.5 ms of GIL time per pipeline to create a
# run's instance, 4.4 ms without (``make profile --regular``, the mean of
# chain-1/chain-3/fanout-5). limits is shared although it defines LimiterWorkflow: its
# PermitSignals mixin and permit book are the same classes for the pipeline, the chunks
# and the limiter.
SHARED_WORKFLOW_MODULES = (
    "aiworker.workflows.agent_step",
    "aiworker.workflows.budget",
    "aiworker.workflows.callbacks",
    "aiworker.workflows.calls",
    "aiworker.workflows.chunks",
    "aiworker.workflows.dag",
    "aiworker.workflows.details",
    "aiworker.workflows.fanout",
    "aiworker.workflows.flow_book",
    "aiworker.workflows.governed",
    "aiworker.workflows.items",
    "aiworker.workflows.limits",
    "aiworker.workflows.pipeline_body",
    "aiworker.workflows.pipeline_limits",
    "aiworker.workflows.redrive",
    "aiworker.workflows.review",
    "aiworker.workflows.runs",
    "aiworker.workflows.state",
    "aiworker.workflows.step_events",
    "aiworker.workflows.steps",
    "aiworker.workflows.tally",
    "aiworker.workflows.wait_step",
)


OWN_WORKFLOW_MODULES = "aiworker.workflows."
"""The package of aiworker's own workflows (:class:`OwnWorkflowsRunner`)."""
_UNSANDBOXED = UnsandboxedWorkflowRunner()  # stateless: one for every run


@dataclass(frozen=True)
class OwnWorkflowsRunner(SandboxedWorkflowRunner):
    """The SDK's sandbox for every workflow but aiworker's own, which run
    unsandboxed (``AIWORKER_WORKFLOW_SANDBOX=true`` sandboxes them too).

    Why: the sandbox runs each activation, and each payload the SDK's payload
    visitor meets on the way out, through ``exec`` of source text inside its
    import hooks, and builds a run's instance by re-importing its workflow
    module. Measured with ``bench.throughput``'s stack (every step a regular
    activity, 100 pipelines a round, 20 in flight, 3 rounds interleaved, one
    quiet 2-core machine), aiworker's worker CPU per pipeline against bare
    sandboxed Temporal went from 1.81/1.85/1.86 (chain-1/chain-3/fanout-5)
    sandboxed to 1.15/1.22/1.42 unsandboxed, and throughput from
    0.70/0.65/0.64 to 0.88/0.80/0.72.

    What the sandbox checked is checked elsewhere, on every build: the replay
    tests replay every committed history of these workflows in the SDK's
    default sandbox (restrictions on, nothing passed through), and
    ``prepare_workflow`` still validates each of them in this sandbox when a
    worker starts; their modules keep no mutable module state
    (tests/workers/test_sandbox_modules.py). A user's workflow registered beside
    them (:class:`AiworkerPlugin` on a user's Worker) keeps the sandbox, with
    the user's own restrictions.
    """

    sandbox_own: bool = False

    def sandboxes(self, defn: workflow._Definition) -> bool:
        """Whether runs of ``defn`` go through the sandbox: all but aiworker's own,
        unless ``sandbox_own``."""
        return self.sandbox_own or not defn.cls.__module__.startswith(OWN_WORKFLOW_MODULES)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        if self.sandboxes(det.defn):
            return super().create_instance(det)
        return _UNSANDBOXED.create_instance(det)


def workflow_runner(sandbox_own: bool = False) -> OwnWorkflowsRunner:
    """The runner of every aiworker worker: the SDK's sandbox (restrictions on,
    aiworker's shared modules passed through) for other workflows, and
    aiworker's own unsandboxed unless ``sandbox_own``."""
    return OwnWorkflowsRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*SHARED_WORKFLOW_MODULES),
        sandbox_own=sandbox_own,
    )


def with_shared_modules(runner: WorkflowRunner | None, sandbox_own: bool = False) -> WorkflowRunner:
    """``runner`` with aiworker's shared workflow modules passed through its sandbox
    and aiworker's own workflows run as :class:`OwnWorkflowsRunner` runs them.

    A sandboxed runner keeps its own restrictions and gains the pass-throughs; a
    user's unsandboxed runner is left as it is (nothing to pass through).
    """
    if runner is None:
        return workflow_runner(sandbox_own)
    if not isinstance(runner, SandboxedWorkflowRunner):
        return runner
    return OwnWorkflowsRunner(
        restrictions=runner.restrictions.with_passthrough_modules(*SHARED_WORKFLOW_MODULES),
        runner_class=runner.runner_class,
        sandbox_own=sandbox_own,
    )


def _with_aiworker_converter(settings: Settings) -> Callable[[DataConverter | None], DataConverter]:
    def apply(existing: DataConverter | None) -> DataConverter:
        # aiworker's payloads are pydantic models with its failure and payload
        # converters: its workflows cannot run under another payload converter.
        # A user's payload codec (encryption, compression) is kept.
        from aiworker.workers.client.temporal_client import data_converter

        ours = data_converter(settings)
        if (
            existing is not None
            and existing.payload_codec is not None
            and ours.payload_codec is None
        ):
            import dataclasses

            return dataclasses.replace(ours, payload_codec=existing.payload_codec)
        return ours

    return apply


class AiworkerPlugin(SimplePlugin):
    """aiworker's workflows, activities, converter, sandbox pass-throughs,
    interceptors and workflow failure types for one base queue, on a user's
    ``Client`` and ``Worker``."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        queue: str = names.PIPELINES_QUEUE,
        workers: WorkerSet | None = None,
        runtime: WorkerRuntime | None = None,
        replace: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        """``settings``: aiworker's (from the environment when omitted); ``queue``:
        the base queue served; ``workers``: the AI workers served (built-ins when
        omitted); ``runtime``: the activities' shared runtime (built from
        ``settings`` when omitted, as a worker process builds it); ``replace``: worker
        ids to same-name stand-in activities (tests, local development)."""
        from aiworker.workers.process.task_queues import (
            WORKFLOWS_BY_QUEUE,
            activities_for,
            all_queues,
        )

        self.settings = settings if settings is not None else Settings()
        served = workers if workers is not None else builtin_set()
        if runtime is None:
            from aiworker.workers.process.resources import build_runtime

            runtime = build_runtime(self.settings, workers=workers)
        known = all_queues(runtime.specs, served)
        if queue not in known:
            raise ValueError(f"unknown task queue {queue!r}; known: {', '.join(known)}")
        self.queue = queue
        self.runtime = runtime
        # a stand-in replaces the worker of its id (activity name = worker id)
        acts = activities_for(queue, runtime, served, skip=replace or ())
        acts += [
            fn
            for wid, fn in (replace or {}).items()
            if wid in runtime.specs and runtime.specs[wid].task_queue == queue
        ]
        super().__init__(
            PLUGIN_NAME,
            data_converter=_with_aiworker_converter(self.settings),
            interceptors=[runtime.interceptor()],
            activities=list(acts),
            workflows=list(WORKFLOWS_BY_QUEUE.get(queue, [])),
            workflow_runner=lambda runner: with_shared_modules(
                runner, self.settings.workflow_sandbox
            ),
            workflow_failure_exception_types=list(WORKFLOW_FAILURE_TYPES),
        )

    @property
    def task_queue(self) -> str:
        """The Temporal task queue the user's Worker must poll (with the settings' suffix)."""
        return self.settings.queue(self.queue)
