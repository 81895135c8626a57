"""The live worker registry from a process's side: publishing what it serves,
and reading what every live process serves.

**Publishing** (:class:`RegistryPublisher`, :func:`publishing`): a worker
process (``aiworker worker``, ``aiworker dev``) publishes its
:class:`~aiworker.schemas.live_registry.ProcessEntry` with update-with-start
to the registry workflow of its namespace and queue family
(``workflows/worker_registry.py``, on the pipelines task queue), again every
third of ``AIWORKER_REGISTRY_TTL_SECONDS`` while it polls, and withdraws it
when it stops gracefully. All of it runs in the background and is bounded:
a process that serves only ``aiworker-scrape`` starts and polls whether or
not a pipelines worker is up to run the registry; a failed publish is logged
(once per failing streak) and tried again at the next refresh.

Each entry is signed with the deployment's ``AIWORKER_REGISTRY_SECRET``
(HMAC-SHA256, ``schemas/live_registry.py``; unsigned when the process has no
secret), and names the owner of its record: the sha256 of a key this process
alone holds, which its withdraw sends.

**Reading** (:func:`read_registry`, :func:`resolve_view`): the ``entries``
query with a short RPC timeout. Each entry is validated whole on its own: one
not signed with this process's secret, of another major protocol version or
malformed in any part is ignored with a warning naming the process, and the
rest are used. The result is a :class:`WorkerView`: the specs a pipeline is
checked against, the model aliases the live workers have, and where they came
from: the live registry when it answers and lists a process, else the local
specs (spec files, installed plugins) with the reason, so every client says
which it used. A process without a secret uses no published spec at all (it
could not tell a real entry from a forged one), and a built-in worker's spec
is always this process's own, whatever an entry says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import SecretStr
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.common import AutoUpgradeVersioningOverride, WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.caps import Caps
from aiworker.schemas.live_registry import (
    OWNER_FIELD,
    ModelAliasEntry,
    ProcessEntry,
    PublishRequest,
    RegistryState,
    ServedWorker,
    WithdrawRequest,
    owner_of,
    parse_entry,
    sign_entry,
    spec_hash,
)
from aiworker.schemas.pipeline import PipelineSpec
from aiworker.schemas.spec import PromptImplementation, WorkerSpec, version_key
from aiworker.workflows.worker_registry import WorkerRegistryWorkflow

log = logging.getLogger("aiworker.registry")

# How long a client waits for the registry (connect, then the query) before it
# checks against local specs instead.
READ_TIMEOUT_SECONDS = 3.0
# How long one publish (update-with-start) or withdraw may take.
PUBLISH_TIMEOUT_SECONDS = 10.0
# Why a process without a registry secret uses only its local specs.
NO_SECRET_REASON = (
    "AIWORKER_REGISTRY_SECRET is not set, so the live registry's entries cannot be "
    "authenticated and no published spec is used"
)
# said once per process, not at every run config
_said_no_secret = False


def secret_bytes(secret: SecretStr | bytes | None) -> bytes | None:
    """The registry secret as the key of its HMAC; None when there is none."""
    if secret is None or isinstance(secret, bytes):
        return secret
    return secret.get_secret_value().encode()


def _say_no_secret(why: str) -> None:
    global _said_no_secret
    if not _said_no_secret:
        _said_no_secret = True
        log.warning(
            "registry.no_secret",
            extra={"aiworker": {"event": "registry_no_secret", "reason": why}},
        )


# --- publishing ---------------------------------------------------------------------


def process_entry(
    *,
    identity: str,
    build_id: str,
    task_queues: Sequence[str],
    specs: Mapping[str, WorkerSpec],
    served: Collection[str],
    model_providers: Mapping[str, str] | None = None,
) -> ProcessEntry:
    """The entry of a process polling ``task_queues`` (suffixed) that serves the
    workers ``served`` of ``specs`` on them.

    External workers of ``specs`` are listed as known but not served (the
    process calls them); ``model_providers`` (alias -> provider kind) is
    published only when the process serves a worker that calls a model.
    """
    workers = [
        ServedWorker(
            worker_id=s.worker_id,
            version=s.version,
            spec_hash=spec_hash(s),
            task_queue=s.task_queue,
            kind=s.kind,
            execution=s.execution,
            served=s.kind != "external",
            spec=s.model_dump(mode="json"),
        )
        for wid, s in sorted(specs.items())
        if wid in served or s.kind == "external"
    ]
    uses_models = any(
        w.worker_id == names.LLM_CALL
        or isinstance(specs[w.worker_id].implementation, PromptImplementation)
        for w in workers
        if w.served
    )
    models = None
    if uses_models and model_providers:
        models = [ModelAliasEntry(name=a, provider=p) for a, p in sorted(model_providers.items())]
    return ProcessEntry(
        identity=identity,
        build_id=build_id,
        task_queues=list(task_queues),
        workers=workers,
        models=models,
    )


def served_on(
    specs: Mapping[str, WorkerSpec], served: Collection[str], queues: Collection[str]
) -> set[str]:
    """The workers of ``served`` a process polling the base ``queues`` runs: those on
    its queues, and the child-workflow workers (``llm-agent``) when it polls the
    pipelines queue."""
    out = {w for w in served if w in specs and specs[w].task_queue in queues}
    if names.PIPELINES_QUEUE in queues:
        out |= {w for w, s in specs.items() if s.kind == "workflow"}
    return out


def model_providers(language_model: Any) -> dict[str, str]:
    """alias -> provider kind of a process's model registry (nothing else of it)."""
    registry = getattr(language_model, "registry", None)
    out: dict[str, str] = {}
    for alias in getattr(registry, "aliases", None) or ():
        config = registry.get(alias) if registry is not None else None
        out[alias] = str(getattr(config, "provider", "unknown"))
    return out


def live_entry(
    client: Client, settings: Settings, runtime: Any, workers: Any, queues: Sequence[str]
) -> ProcessEntry:
    """The entry of a worker process: ``runtime`` (a ``WorkerRuntime``) and
    ``workers`` (its ``WorkerSet``) polling the base ``queues``; identity is the
    client's (the SDK's ``pid@host``), the build id :func:`build_id`'s."""
    from aiworker.workers.process.deployments import build_id

    specs: Mapping[str, WorkerSpec] = workers.specs
    return process_entry(
        identity=client.identity,
        build_id=build_id(settings),
        task_queues=[settings.queue(q) for q in queues],
        specs=specs,
        served=served_on(specs, workers.served, queues),
        model_providers=model_providers(runtime.tools.get("language_model")),
    )


class RegistryPublisher:
    """Publishes one process's entry while it polls, and withdraws it at the end.

    Args:
        client: the process's client.
        settings: its settings (queue suffix, ``registry_ttl_seconds``).
        entry: what it serves.
        ttl_seconds: how long an entry lives unless refreshed; refreshed every third.
        timeout: bound of one publish or withdraw.
    """

    def __init__(
        self,
        client: Client,
        settings: Settings,
        entry: ProcessEntry,
        *,
        ttl_seconds: float | None = None,
        timeout: float = PUBLISH_TIMEOUT_SECONDS,
    ) -> None:
        self.client = client
        self.settings = settings
        self.entry = entry
        self.ttl_seconds = ttl_seconds if ttl_seconds is not None else settings.registry_ttl_seconds
        self.timeout = timeout
        self.workflow_id = names.worker_registry_workflow_id(settings.task_queue_suffix)
        self.published = asyncio.Event()
        # the record's owner is this key's hash: only this object can withdraw or
        # replace the record while it lives (the key is sent only to withdraw)
        self._key = secrets.token_hex(32)
        secret = secret_bytes(settings.registry_secret)
        if secret is None:
            _say_no_secret(
                "AIWORKER_REGISTRY_SECRET is not set: this process publishes an unsigned "
                "entry, which processes with a secret ignore, and uses no published spec"
            )
        owned = {**entry.model_dump(mode="json"), OWNER_FIELD: owner_of(self._key)}
        self._signed = sign_entry(owned, secret)

    async def publish_once(self) -> int:
        """Publish the entry (update-with-start); the number of processes listed."""
        request = PublishRequest(
            identity=self.entry.identity,
            ttl_seconds=self.ttl_seconds,
            entry=self._signed,
        )
        start = WithStartWorkflowOperation(
            WorkerRegistryWorkflow.run,
            RegistryState(),
            id=self.workflow_id,
            task_queue=self.settings.queue(names.PIPELINES_QUEUE),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary="aiworker live worker registry",
            # like the limiter: a long-lived workflow follows the current build (its
            # continue-as-new runs inherit the override), so a drained build can stop
            versioning_override=AutoUpgradeVersioningOverride(),
        )
        return await asyncio.wait_for(
            self.client.execute_update_with_start_workflow(
                WorkerRegistryWorkflow.publish,
                request,
                start_workflow_operation=start,
                rpc_timeout=timedelta(seconds=self.timeout),
            ),
            self.timeout,
        )

    async def withdraw(self) -> None:
        """Take the entry back (a signal: the registry need not be running a task)."""
        handle = self.client.get_workflow_handle(self.workflow_id)
        await asyncio.wait_for(
            handle.signal(
                WorkerRegistryWorkflow.withdraw,
                WithdrawRequest(identity=self.entry.identity, key=self._key),
                rpc_timeout=timedelta(seconds=self.timeout),
            ),
            self.timeout,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Publish now and every ``ttl/3`` until ``stop``; then withdraw. Never raises."""
        failing = False
        while not stop.is_set():
            try:
                count = await self.publish_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not failing:
                    log.warning(
                        "registry.publish_failed",
                        extra={
                            "aiworker": {
                                "event": "registry_publish_failed",
                                "workflow_id": self.workflow_id,
                                "error": f"{type(e).__name__}: {e}",
                            }
                        },
                    )
                failing = True
            else:
                if failing or not self.published.is_set():
                    log.info(
                        "registry.published",
                        extra={
                            "aiworker": {
                                "event": "registry_published",
                                "workflow_id": self.workflow_id,
                                "processes": count,
                            }
                        },
                    )
                failing = False
                self.published.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.ttl_seconds / 3)
        try:
            await self.withdraw()
        except Exception as e:
            log.warning(
                "registry.withdraw_failed",
                extra={
                    "aiworker": {
                        "event": "registry_withdraw_failed",
                        "error": f"{type(e).__name__}: {e}",
                    }
                },
            )


@contextlib.asynccontextmanager
async def publishing(
    client: Client,
    settings: Settings,
    entry: ProcessEntry,
    *,
    ttl_seconds: float | None = None,
    until: asyncio.Event | None = None,
) -> AsyncIterator[RegistryPublisher]:
    """Publish ``entry`` in the background for the block; withdraw it when ``until``
    is set (a process told to stop withdraws before it drains) or on the way out."""
    publisher = RegistryPublisher(client, settings, entry, ttl_seconds=ttl_seconds)
    stop = asyncio.Event()
    task = asyncio.create_task(publisher.run(stop))
    relay = asyncio.create_task(until.wait()) if until is not None else None
    if relay is not None:
        relay.add_done_callback(lambda _: stop.set())
    try:
        yield publisher
    finally:
        if relay is not None:
            relay.cancel()
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), publisher.timeout * 2 + 1)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()


# --- reading ------------------------------------------------------------------------


class RegistryUnreadableError(RuntimeError):
    """The registry exists but could not be read; the message says why, in one line."""


@dataclass(frozen=True)
class LiveRegistry:
    """What the live processes of one namespace and queue family serve.

    Attributes:
        processes: the entries this client reads, by identity order.
        warnings: one line per entry ignored (naming its process).
        trusted: the entries were authenticated with the registry secret; when
            false, :meth:`specs` gives no published spec.
    """

    processes: tuple[ProcessEntry, ...]
    warnings: tuple[str, ...] = ()
    trusted: bool = False

    def offers(self) -> dict[str, list[tuple[ProcessEntry, ServedWorker]]]:
        """Each worker id with every process that lists it."""
        out: dict[str, list[tuple[ProcessEntry, ServedWorker]]] = {}
        for p in self.processes:
            for w in p.workers:
                out.setdefault(w.worker_id, []).append((p, w))
        return out

    def specs(self) -> dict[str, WorkerSpec]:
        """One spec per worker id some process lists: a built-in's is this process's
        own (never a published one); else a served one over a merely known
        (external) one, then the highest version, then the spec most processes
        publish. Only built-ins when the entries are not :attr:`trusted`."""
        out: dict[str, WorkerSpec] = {}
        builtins = load_specs()
        for wid, offers in self.offers().items():
            if wid in builtins:
                out[wid] = builtins[wid]
                continue
            if not self.trusted:
                continue
            counts: dict[str, int] = {}
            for _, w in offers:
                counts[w.spec_hash] = counts.get(w.spec_hash, 0) + 1
            _, best = max(
                offers,
                key=lambda o: (o[1].served, version_key(o[1].version), counts[o[1].spec_hash]),
            )
            out[wid] = WorkerSpec.model_validate(best.spec)
        return out

    def served(self) -> set[str]:
        """The worker ids some live process serves itself (external ones excluded)."""
        return {w.worker_id for p in self.processes for w in p.workers if w.served}

    def aliases(self) -> set[str] | None:
        """The model aliases the live processes have; None when none publishes models."""
        published = [p.models for p in self.processes if p.models is not None]
        if not published:
            return None
        return {m.name for models in published for m in models}

    def conflicts(self) -> list[str]:
        """One line per worker id and version published with different spec hashes."""
        out = []
        for wid, offers in sorted(self.offers().items()):
            by_version: dict[str, dict[str, list[str]]] = {}
            for p, w in offers:
                by_version.setdefault(w.version, {}).setdefault(w.spec_hash, []).append(p.identity)
            for version, hashes in sorted(by_version.items()):
                if len(hashes) > 1:
                    which = "; ".join(
                        f"{h[:12]} by {', '.join(sorted(ids))}" for h, ids in sorted(hashes.items())
                    )
                    out.append(
                        f"worker {wid!r} version {version} is served with {len(hashes)} "
                        f"different specs: {which}"
                    )
        return out


async def read_registry(
    client: Client,
    queue_suffix: str = "",
    *,
    secret: SecretStr | bytes | None,
    read_timeout: float = READ_TIMEOUT_SECONDS,
) -> LiveRegistry | None:
    """The live registry of ``client``'s namespace and the queue family ``queue_suffix``;
    None when no process ever published there. With ``secret``, only the entries it
    authenticates (the others ignored with a warning each); without, every
    well-formed entry, not :attr:`~LiveRegistry.trusted`.

    Raises:
        RegistryUnreadableError: the query failed or did not answer in ``read_timeout``.
    """
    workflow_id = names.worker_registry_workflow_id(queue_suffix)
    handle = client.get_workflow_handle_for(WorkerRegistryWorkflow.run, workflow_id)
    try:
        snapshot = await asyncio.wait_for(
            handle.query(
                WorkerRegistryWorkflow.entries, rpc_timeout=timedelta(seconds=read_timeout)
            ),
            read_timeout + 1,
        )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        if e.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
            raise RegistryUnreadableError(
                f"the live registry ({workflow_id}) did not answer within {read_timeout:g}s "
                f"(is a worker process polling {names.PIPELINES_QUEUE}{queue_suffix}?)"
            ) from None
        raise RegistryUnreadableError(
            f"the live registry ({workflow_id}) cannot be read: {e.message}"
        ) from None
    except TimeoutError:
        raise RegistryUnreadableError(
            f"the live registry ({workflow_id}) did not answer within {read_timeout:g}s"
        ) from None
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as e:
        raise RegistryUnreadableError(
            f"the live registry ({workflow_id}) cannot be read: {e}"
        ) from None
    except Exception as e:  # an answer this client cannot decode
        raise RegistryUnreadableError(
            f"the live registry ({workflow_id}) cannot be read: {type(e).__name__}: {e}"
        ) from None
    key = secret_bytes(secret)
    processes, warnings = [], []
    for identity, record in sorted(snapshot.records.items()):
        entry, warning = parse_entry(identity, record.entry, key)
        if warning is not None:
            log.warning(
                "registry.entry_ignored",
                extra={
                    "aiworker": {
                        "event": "registry_entry_ignored",
                        "identity": identity,
                        "reason": warning,
                    }
                },
            )
            warnings.append(warning)
        if entry is not None:
            processes.append(entry)
    return LiveRegistry(tuple(processes), tuple(warnings), trusted=key is not None)


async def live_specs(
    client: Client, queue_suffix: str = "", *, secret: SecretStr | bytes | None
) -> dict[str, WorkerSpec]:
    """The specs the live registry publishes, for a run's run config (which records
    them); empty, with a warning, when no process published, the registry cannot
    be read or there is no ``secret`` to authenticate it (said once per process):
    the run then knows only the answering process's own workers."""
    if secret is None:
        _say_no_secret(NO_SECRET_REASON)
        return {}
    try:
        live = await read_registry(client, queue_suffix, secret=secret)
    except RegistryUnreadableError as e:
        log.warning(
            "registry.unreadable",
            extra={"aiworker": {"event": "registry_unreadable", "error": str(e)}},
        )
        return {}
    return live.specs() if live is not None else {}


@dataclass(frozen=True)
class WorkerView:
    """The workers a pipeline is checked against, and where they came from.

    Attributes:
        specs: every worker's spec by id.
        source: ``live`` (the live registry) or ``local`` (this process's spec
            files and installed plugins).
        reason: why the local specs were used (empty for ``live``).
        registry: what was read of the live registry, when anything was.
    """

    specs: Mapping[str, WorkerSpec]
    source: Literal["live", "local"]
    reason: str = ""
    registry: LiveRegistry | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def aliases(self) -> set[str] | None:
        """The live workers' model aliases; None: check the settings' own."""
        if self.source != "live" or self.registry is None:
            return None
        return self.registry.aliases()

    def describe(self) -> str:
        """``the live registry (3 processes)`` or ``local specs (<why>)``."""
        if self.source == "live" and self.registry is not None:
            n = len(self.registry.processes)
            return f"the live registry ({n} process{'' if n == 1 else 'es'})"
        return f"local specs ({self.reason})" if self.reason else "local specs"

    def check(self, raw: Any, settings: Settings, caps: Caps | None = None) -> PipelineSpec:
        """:func:`~aiworker.workers.process.pipeline_settings.check_spec` against these
        workers (and the live model aliases, when the live workers have models)."""
        from aiworker.workers.process.pipeline_settings import check_spec

        return check_spec(raw, dict(self.specs), settings, caps, aliases=self.aliases)


async def resolve_view(
    client: Client | None,
    settings: Settings,
    local: Callable[[], Mapping[str, WorkerSpec]],
    *,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    why_no_client: str = "",
) -> WorkerView:
    """The live registry's view when it answers and lists a process, else the
    local specs (``local()``, called only then) with the reason; the local specs
    too when ``settings`` have no registry secret (the registry is not read)."""
    reason = why_no_client or "no Temporal client"
    registry: LiveRegistry | None = None
    if client is not None and settings.registry_secret is None:
        reason = NO_SECRET_REASON
    elif client is not None:
        try:
            registry = await read_registry(
                client,
                settings.task_queue_suffix,
                secret=settings.registry_secret,
                read_timeout=read_timeout,
            )
        except RegistryUnreadableError as e:
            reason = str(e)
        else:
            if registry is None:
                reason = "no worker process has published to the live registry"
            elif not registry.processes:
                reason = "the live registry lists no live worker process"
            else:
                return WorkerView(registry.specs(), "live", "", registry, registry.warnings)
    warnings = registry.warnings if registry is not None else ()
    return WorkerView(local(), "local", reason, registry, warnings)


__all__ = [
    "NO_SECRET_REASON",
    "LiveRegistry",
    "RegistryPublisher",
    "RegistryUnreadableError",
    "WorkerView",
    "live_entry",
    "model_providers",
    "process_entry",
    "publishing",
    "read_registry",
    "resolve_view",
    "secret_bytes",
    "served_on",
]
