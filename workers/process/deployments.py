"""Worker Deployment Versioning: which build a worker process is, and what each build runs.

A worker process with ``AIWORKER_VERSIONING`` on (unset: on in ``aiworker
worker`` and ``dev``, off where workers are built in code) polls as one version
of a Temporal Worker Deployment: the deployment is
``AIWORKER_DEPLOYMENT_NAME`` plus the task-queue suffix (an isolated stack is an
isolated deployment), the build id is ``AIWORKER_BUILD_ID`` or, by default, the
package version plus a hash of the workflow code (:func:`build_id`, the one
place that computes it). Every workflow of a versioned process is ``PINNED``
(the worker's default behavior, :func:`deployment_config`): a pipeline, its
for_each chunks and agent children finish on the build they started on. The
long-lived limiter and breaker workflows are started with an auto-upgrade
override (``activities/limits.py``, ``activities/breakers.py``): they move to
the current build at their next task.

Temporal sends new workflows to the deployment's *current* version, so a
version that is not current gets nothing. Who makes a build current is
``AIWORKER_DEPLOYMENT_CURRENT``: ``auto`` (default) -- the process itself when
the deployment has no current version yet (a first deploy, compose, one
process); ``always`` -- the process itself (``aiworker dev``); ``never`` -- the
operator, with ``aiworker deployment set-current`` or ``ramp``. A process whose
build is not current says so in its log and on stderr, with the command to run.

Temporal's Python SDK has no high-level client for deployments yet, so the
operations here are the workflow service's requests (DescribeWorkerDeployment,
SetWorkerDeploymentCurrentVersion, ...), as the ``temporal worker deployment``
commands send them; "still running on a build" is a visibility count over
``TemporalWorkerDeploymentVersion``, which answers at once, beside the server's
own drainage status, which it refreshes only every few minutes.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    ListWorkerDeploymentsRequest,
    SetWorkerDeploymentCurrentVersionRequest,
    SetWorkerDeploymentRampingVersionRequest,
)
from temporalio.client import Client
from temporalio.common import (
    VersioningBehavior,
    WorkerDeploymentVersion,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from aiworker.config.settings import Settings

log = logging.getLogger("aiworker.deployments")

PACKAGE = "aiworker"
WORKFLOWS_PACKAGE = "aiworker.workflows"
SCHEMAS_PACKAGE = "aiworker.schemas"
# Length of the code hash in a default build id (hex digits of SHA-256).
CODE_HASH_DIGITS = 12


class DeploymentError(RuntimeError):
    """A deployment operation Temporal refused or could not answer; the message says which.

    Attributes:
        not_found: the deployment or build does not exist (no worker of it polled).
    """

    def __init__(self, message: str, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


# --- which build this process is ------------------------------------------------------------


def deployment_name(settings: Settings) -> str:
    """The Worker Deployment of this stack: the name plus the task-queue suffix.

    Temporal spells a version ``<deployment>.<build id>``, so a ``.`` of the
    suffix becomes ``-``.
    """
    return (settings.deployment_name + settings.task_queue_suffix).replace(".", "-")


def _module_file(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin) if spec is not None and spec.origin else None


def _imported_modules(source: str) -> set[str]:
    """The ``aiworker.workflows`` and ``aiworker.schemas`` modules a source imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module in (WORKFLOWS_PACKAGE, SCHEMAS_PACKAGE):
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif node.module.startswith((WORKFLOWS_PACKAGE + ".", SCHEMAS_PACKAGE + ".")):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(
                a.name
                for a in node.names
                if a.name.startswith((WORKFLOWS_PACKAGE + ".", SCHEMAS_PACKAGE + "."))
            )
    return found


@functools.cache
def code_hash() -> str:
    """SHA-256 (hex) over the source of every workflow module and, transitively, every
    ``aiworker.schemas`` module they import: what a replay of a pipeline depends on.

    Read from the source files (``ast``, nothing imported beyond the packages), in
    module-name order, so it is the same for the same code on every machine; computed
    once per process.
    """
    workflows_dir = _module_file(WORKFLOWS_PACKAGE)
    if workflows_dir is None:  # pragma: no cover - the package is always installed
        raise DeploymentError(f"cannot find the {WORKFLOWS_PACKAGE} package")
    modules = (f"{WORKFLOWS_PACKAGE}.{p.stem}" for p in workflows_dir.parent.glob("*.py"))
    todo = [WORKFLOWS_PACKAGE, *sorted(m for m in modules if not m.endswith(".__init__"))]
    seen: dict[str, bytes] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = _module_file(module)
        if path is None or path.suffix != ".py":
            continue  # a name imported from a package, not a module
        source = path.read_bytes()
        seen[module] = source
        todo.extend(_imported_modules(source.decode()) - seen.keys())
    digest = hashlib.sha256()
    for module in sorted(seen):
        digest.update(module.encode() + b"\0" + seen[module] + b"\0")
    return digest.hexdigest()


def build_id(settings: Settings) -> str:
    """This process's build id: ``AIWORKER_BUILD_ID``, else ``<package version>-<code hash>``."""
    if settings.build_id:
        return settings.build_id
    return f"{importlib.metadata.version(PACKAGE)}-{code_hash()[:CODE_HASH_DIGITS]}"


def deployment_version(settings: Settings) -> WorkerDeploymentVersion:
    """The Worker Deployment version this process polls as."""
    return WorkerDeploymentVersion(
        deployment_name=deployment_name(settings), build_id=build_id(settings)
    )


def deployment_config(settings: Settings) -> WorkerDeploymentConfig | None:
    """The ``Worker(deployment_config=...)`` of a worker process; ``None`` unversioned.

    Every workflow of a versioned process is ``PINNED`` (a run ends on the build it
    started on). The behavior is the worker's default, not each ``@workflow.defn``'s:
    Temporal refuses a declared behavior from an unversioned worker, and
    ``PipelineWorkflow`` also runs on unversioned workers (tests, embedded stacks,
    ``AiworkerPlugin`` in a user's worker). The long-lived limiter and breaker
    workflows auto-upgrade through the override they are started with
    (:data:`AUTO_UPGRADE`).
    """
    if not settings.versioning:  # None (unset) is off here: run_worker_process turns it on
        return None
    return WorkerDeploymentConfig(
        version=deployment_version(settings),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


def version_key(version: WorkerDeploymentVersion) -> str:
    """The value of the ``TemporalWorkerDeploymentVersion`` search attribute."""
    return f"{version.deployment_name}:{version.build_id}"


# --- what a deployment runs -----------------------------------------------------------------


@dataclass
class VersionState:
    """One build of a deployment, as ``aiworker deployment`` shows it.

    Attributes:
        build_id: the build.
        status: ``current``, ``ramping``, ``draining``, ``drained`` or ``inactive``.
        ramp_percentage: the share of new workflows it gets while ramping.
        running: workflows still open on it (pinned runs it must finish), or ``None``
            when visibility did not answer.
        created: when its first poller arrived (RFC 3339).
    """

    build_id: str
    status: str
    ramp_percentage: float = 0.0
    running: int | None = None
    created: str = ""


@dataclass
class DeploymentState:
    """A deployment: its current and ramping build and every version it has seen."""

    name: str
    current: str | None
    ramping: str | None
    ramp_percentage: float
    versions: list[VersionState] = field(default_factory=list)

    def version(self, build: str) -> VersionState | None:
        """The state of ``build``, or ``None`` when it never polled."""
        return next((v for v in self.versions if v.build_id == build), None)

    def as_json(self) -> dict[str, Any]:
        """The ``--json`` form."""
        return {
            "deployment": self.name,
            "current": self.current,
            "ramping": self.ramping,
            "ramp_percentage": self.ramp_percentage,
            "versions": [vars(v) for v in self.versions],
        }


_STATUS = {
    1: "inactive",
    2: "current",
    3: "ramping",
    4: "draining",
    5: "drained",
}


async def list_deployments(client: Client) -> list[str]:
    """The names of the namespace's Worker Deployments."""
    names: list[str] = []
    token = b""
    while True:
        resp = await _read(
            client.workflow_service.list_worker_deployments,
            ListWorkerDeploymentsRequest(namespace=client.namespace, next_page_token=token),
        )
        names += [d.name for d in resp.worker_deployments]
        token = resp.next_page_token
        if not token:
            return sorted(names)


async def running_on(client: Client, version: WorkerDeploymentVersion) -> int:
    """How many workflows are still running on ``version`` (visibility count)."""
    resp = await client.count_workflows(
        f"TemporalWorkerDeploymentVersion = '{version_key(version)}' "
        "AND ExecutionStatus = 'Running'"
    )
    return resp.count


async def describe_deployment(client: Client, name: str, *, count: bool = True) -> DeploymentState:
    """The deployment ``name``: current, ramping, each version's status and open runs.

    Raises:
        DeploymentError: no such deployment (no worker of it ever polled).
    """
    request = DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
    try:
        resp = await _read(client.workflow_service.describe_worker_deployment, request)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise DeploymentError(
                f"no worker deployment {name!r} (no worker of it polled)", not_found=True
            ) from None
        raise
    info = resp.worker_deployment_info
    routing = info.routing_config
    current = routing.current_deployment_version.build_id or None
    ramping = routing.ramping_deployment_version.build_id or None
    state = DeploymentState(
        name=name,
        current=current,
        ramping=ramping,
        ramp_percentage=routing.ramping_version_percentage if ramping else 0.0,
    )
    for summary in info.version_summaries:
        build = summary.deployment_version.build_id
        status = _STATUS.get(int(summary.status), "inactive")
        state.versions.append(
            VersionState(
                build_id=build,
                status=status,
                ramp_percentage=state.ramp_percentage if build == ramping else 0.0,
                created=summary.create_time.ToJsonString()
                if summary.HasField("create_time")
                else "",
            )
        )
    state.versions.sort(key=lambda v: v.created)
    if count:
        for v in state.versions:
            try:
                v.running = await running_on(client, WorkerDeploymentVersion(name, v.build_id))
            except RPCError:
                v.running = None
    return state


async def set_current(client: Client, name: str, build: str, *, wait_seconds: float = 0.0) -> None:
    """Make ``build`` the current version of deployment ``name`` (new workflows go there).

    ``wait_seconds``: how long to ask again while the build's task queues register
    (a process making itself current just after its first poll).

    Raises:
        DeploymentError: the build never polled, or Temporal refused.
    """
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace,
        deployment_name=name,
        build_id=build,
        identity=client.identity,
        ignore_missing_task_queues=True,
    )
    try:
        await _until_registered(
            client.workflow_service.set_worker_deployment_current_version, request, wait_seconds
        )
    except RPCError as e:
        raise DeploymentError(
            f"cannot make {name}/{build} current: {e.message}",
            not_found=e.status == RPCStatusCode.NOT_FOUND,
        ) from None


async def set_ramping(client: Client, name: str, build: str | None, percentage: float) -> None:
    """Send ``percentage`` of new workflows to ``build`` (``None``/0: stop ramping).

    Raises:
        DeploymentError: the build never polled, or Temporal refused.
    """
    try:
        await client.workflow_service.set_worker_deployment_ramping_version(
            SetWorkerDeploymentRampingVersionRequest(
                namespace=client.namespace,
                deployment_name=name,
                build_id=build or "",
                percentage=percentage if build else 0.0,
                identity=client.identity,
                ignore_missing_task_queues=True,
            )
        )
    except RPCError as e:
        raise DeploymentError(
            f"cannot ramp {name}/{build}: {e.message}",
            not_found=e.status == RPCStatusCode.NOT_FOUND,
        ) from None


# --- what a process does at start -----------------------------------------------------------


async def _wait_registered(
    client: Client, version: WorkerDeploymentVersion, wait_seconds: float
) -> DeploymentState | None:
    """The deployment once ``version`` is in it (its pollers register it), or ``None``."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            state = await describe_deployment(client, version.deployment_name, count=False)
            if state.version(version.build_id) is not None:
                return state
        except DeploymentError:
            pass
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(0.2)


def _say(message: str, event: str, **fields: Any) -> None:
    log.warning(message, extra={"aiworker": {"event": event, **fields}})
    print(f"aiworker: {message}", file=sys.stderr, flush=True)


async def ensure_current(
    client: Client, settings: Settings, *, wait_seconds: float = 30.0
) -> str | None:
    """After this process polls: make its build current as ``AIWORKER_DEPLOYMENT_CURRENT``
    says, or say clearly that it is not current and gets no new workflows.

    Returns the deployment's current build afterwards (``None``: none, or unknown).
    """
    version = deployment_version(settings)
    mode = settings.deployment_current
    state = await _wait_registered(client, version, wait_seconds)
    if state is None:
        _say(
            f"build {version.build_id} of deployment {version.deployment_name} did not "
            f"register within {wait_seconds:g}s; it may get no work",
            "deployment_unregistered",
            deployment=version.deployment_name,
            build_id=version.build_id,
        )
        return None
    if state.current == version.build_id:
        log.info(
            "deployment.current",
            extra={"aiworker": {"event": "deployment_current", "build_id": version.build_id}},
        )
        return state.current
    if mode == "always" or (mode == "auto" and state.current is None):
        await set_current(
            client, version.deployment_name, version.build_id, wait_seconds=wait_seconds
        )
        log.info(
            "deployment.made_current",
            extra={
                "aiworker": {
                    "event": "deployment_made_current",
                    "deployment": version.deployment_name,
                    "build_id": version.build_id,
                    "previous": state.current,
                }
            },
        )
        return version.build_id
    share = (
        f"; it gets {state.ramp_percentage:g}% of new workflows (ramping)"
        if state.ramping == version.build_id
        else "; it gets no new workflows"
    )
    _say(
        f"build {version.build_id} is not the current version of deployment "
        f"{version.deployment_name} (current: {state.current or 'none'}){share}. Make it "
        f"current with: aiworker deployment set-current {version.build_id}",
        "deployment_not_current",
        deployment=version.deployment_name,
        build_id=version.build_id,
        current=state.current,
    )
    return state.current


@dataclass(frozen=True)
class OtherBuildRun:
    """A run of this deployment pinned to another build, still running."""

    workflow_id: str
    run_id: str
    workflow_type: str
    build_id: str


async def other_build_runs(
    client: Client, settings: Settings, *, limit: int = 10_000
) -> list[OtherBuildRun]:
    """The running pinned runs of this deployment's other builds.

    ``aiworker dev`` lists them at start: a run started by the code before an edit
    waits for a worker of its own build, and this process never replays it on
    code it did not start (a pinned run's next workflow task goes to its build
    only). Auto-upgrade workflows (limiter, breaker, registry, flow) are not
    among them: they move to the current build themselves.
    """
    version = deployment_version(settings)
    query = (
        f"TemporalWorkerDeployment = '{version.deployment_name}' "
        "AND ExecutionStatus = 'Running' "
        f"AND TemporalWorkerDeploymentVersion != '{version_key(version)}' "
        "AND TemporalWorkflowVersioningBehavior = 'Pinned'"
    )
    found: list[OtherBuildRun] = []
    async for wf in client.list_workflows(query, limit=limit):
        # a listing carries no versioning info: the run's own description does
        described = await client.get_workflow_handle(wf.id, run_id=wf.run_id).describe()
        versioning = described.raw_description.workflow_execution_info.versioning_info
        build = versioning.deployment_version.build_id
        if versioning.versioning_override.HasField("pinned"):
            build = versioning.versioning_override.pinned.version.build_id
        found.append(OtherBuildRun(wf.id, wf.run_id, wf.workflow_type, build))
    return found


async def terminate_runs(client: Client, runs: list[OtherBuildRun], reason: str) -> int:
    """Terminate ``runs``; how many were still running to terminate."""
    ended = 0
    for run in runs:
        handle = client.get_workflow_handle(run.workflow_id, run_id=run.run_id)
        try:
            await handle.terminate(reason=reason)
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:  # ended meanwhile: nothing to do
                raise
            continue
        ended += 1
    return ended


#: What a busy server answers a read it could not finish in time (the deployment's
#: own workflow answers describe by query; just after a routing change it can be
#: busy): asked again, never shown to the user.
_TRANSIENT = frozenset(
    {
        RPCStatusCode.CANCELLED,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.ABORTED,
    }
)


async def _asking_again(
    call: Any,
    request: Any,
    statuses: frozenset[RPCStatusCode],
    wait_seconds: float,
    *,
    pause: float,
    most: float,
    **options: Any,
) -> Any:
    """``call(request, **options)``, again while the server answers one of
    ``statuses``: after ``pause`` seconds, doubled up to ``most``, until
    ``wait_seconds`` have passed (then the last error is raised)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return await call(request, **options)
        except RPCError as e:
            if e.status not in statuses or time.monotonic() + pause >= deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, most)


async def _read(call: Any, request: Any, wait_seconds: float = 15.0) -> Any:
    """``call(request)`` for a read, again with backoff while the server answers with a
    transient status (bounded by ``wait_seconds``; then the last error is raised)."""
    return await _asking_again(
        call, request, _TRANSIENT, wait_seconds, pause=0.1, most=2.0, retry=True
    )


async def _until_registered(call: Any, request: Any, wait_seconds: float = 30.0) -> None:
    """``call(request)``, again while the server says this build is not yet in a task
    queue (its pollers register it there a moment after the deployment lists it)."""
    await _asking_again(
        call,
        request,
        frozenset({RPCStatusCode.FAILED_PRECONDITION}),
        wait_seconds,
        pause=0.2,
        most=0.2,
    )
