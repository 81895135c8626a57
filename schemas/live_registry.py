"""The live worker registry's contract: what a worker process publishes, and how
the registry workflow keeps it.

Every worker process publishes one :class:`ProcessEntry` (the workers it
serves with their specs and spec hashes, its task queues, model aliases by
name and provider kind, its build id and identity) to the registry workflow
of its namespace and queue family (``workflows/worker_registry.py``); clients
read the entries and check pipelines against them (``workers/process/live_registry.py``).

The workflow keeps each entry as plain JSON (:class:`PublishRequest.entry`):
it never interprets what a process serves, so a process of a newer protocol
can publish beside older ones, and each reader decides what it understands
(:func:`parse_entry`: an entry of another major protocol version, or one that
fails the model, is ignored with a warning naming the process).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aiworker.schemas.base import Model
from aiworker.schemas.messages import json_path
from aiworker.schemas.spec import WorkerSpec

# major.minor: a reader reads entries of its own major version (a minor adds fields).
REGISTRY_PROTOCOL: Final = "1.0"
# Bounds the registry workflow applies to what it is sent (its update validator).
MAX_PROCESSES: Final = 500
MAX_ENTRY_BYTES: Final = 1_000_000
MIN_TTL_SECONDS: Final = 1.0
MAX_TTL_SECONDS: Final = 86_400.0


def spec_hash(spec: WorkerSpec) -> str:
    """The sha256 of a spec's canonical JSON (sorted keys, no spaces): equal specs,
    equal hashes, whichever process or file they came from."""
    doc = spec.model_dump(mode="json")
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class ModelAliasEntry(BaseModel):
    """A model alias a process configures: its name and provider kind, never its key or URL."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    provider: str


class ServedWorker(BaseModel):
    """One worker in a process's entry.

    ``served`` is false for an external worker the process knows from a spec file
    (it calls it; another process, in any language, serves it).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    worker_id: str
    version: str
    spec_hash: str
    task_queue: str
    kind: str
    execution: str
    served: bool = True
    spec: dict[str, Any]


class ProcessEntry(BaseModel):
    """What one worker process serves (protocol :data:`REGISTRY_PROTOCOL`).

    Attributes:
        protocol: ``major.minor`` of this model.
        identity: the process, as the SDK's identity (``pid@host``).
        build_id: the process's build id (``AIWORKER_BUILD_ID`` or the package
            version plus a hash of the workflow code).
        task_queues: the (suffixed) task queues the process polls.
        workers: the workers it serves or knows (external ones).
        models: the model aliases it configures; None when it configures none
            (or serves no worker that calls a model).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    protocol: str = REGISTRY_PROTOCOL
    identity: str
    build_id: str
    task_queues: list[str]
    workers: list[ServedWorker]
    models: list[ModelAliasEntry] | None = None


class PublishRequest(Model):
    """The ``publish`` update: one process's entry, kept for ``ttl_seconds`` unless
    published again."""

    identity: str = Field(min_length=1, max_length=255)
    ttl_seconds: float = Field(ge=MIN_TTL_SECONDS, le=MAX_TTL_SECONDS, allow_inf_nan=False)
    entry: dict[str, Any]


class RegistryRecord(Model):
    """A published entry and the times (epoch seconds, workflow time) it was
    published and expires."""

    entry: dict[str, Any]
    published_at: float
    expires_at: float


class RegistryState(Model):
    """The registry workflow's state, carried across continue-as-new."""

    records: dict[str, RegistryRecord] = Field(default_factory=dict)


class RegistrySnapshot(Model):
    """The ``entries`` query's answer: every live record, by identity, and the
    workflow's time when it answered."""

    records: dict[str, RegistryRecord]
    now: float


def _first_error(e: ValidationError) -> str:
    first = e.errors()[0]
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{json_path(first['loc'])}: {first['msg']}{more}"


def parse_entry(identity: str, raw: Any) -> tuple[ProcessEntry | None, str | None]:
    """``raw`` as a :class:`ProcessEntry`, or None and a warning naming the process.

    Ignored: an entry of another major protocol version, one that fails the
    model, one whose identity is not the one it was published under, and one
    whose workers' specs fail :class:`WorkerSpec` or do not match their hash.
    """
    where = f"registry entry of process {identity!r}"
    if not isinstance(raw, dict):
        return None, f"ignoring the {where}: not a JSON object"
    protocol = raw.get("protocol")
    major = REGISTRY_PROTOCOL.split(".")[0]
    if not isinstance(protocol, str) or protocol.split(".")[0] != major:
        return None, (
            f"ignoring the {where}: protocol {protocol!r} (this client reads {major}.x; "
            "upgrade aiworker to read it)"
        )
    try:
        entry = ProcessEntry.model_validate(raw)
    except ValidationError as e:
        return None, f"ignoring the malformed {where}: {_first_error(e)}"
    if entry.identity != identity:
        return None, f"ignoring the {where}: it names identity {entry.identity!r}"
    for w in entry.workers:
        try:
            spec = WorkerSpec.model_validate(w.spec)
        except ValidationError as e:
            return None, (
                f"ignoring the malformed {where}: worker {w.worker_id!r}: {_first_error(e)}"
            )
        if spec.worker_id != w.worker_id or spec_hash(spec) != w.spec_hash:
            return None, (
                f"ignoring the malformed {where}: worker {w.worker_id!r}: its spec does not "
                "match its id or hash"
            )
    return entry, None


__all__ = [
    "REGISTRY_PROTOCOL",
    "ModelAliasEntry",
    "ProcessEntry",
    "PublishRequest",
    "RegistryRecord",
    "RegistrySnapshot",
    "RegistryState",
    "ServedWorker",
    "parse_entry",
    "spec_hash",
]
