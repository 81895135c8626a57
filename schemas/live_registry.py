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

**Authentication.** A spec decides where a tenant's data goes (its task queue),
and anyone who can reach the namespace can send the workflow an update, so an
entry carries an HMAC-SHA256 (:func:`sign_entry`, field ``signature``) over its
canonical JSON with the deployment's secret (``AIWORKER_REGISTRY_SECRET``);
a reader with the secret uses only entries whose signature it verifies, and a
reader without one uses no published spec at all. The secret never reaches the
workflow: it cannot verify a signature, so a process proves it owns its record
another way: its entry names the sha256 of a random key only it holds (field
``owner``, :func:`owner_named`), and the workflow accepts a withdraw
(:class:`WithdrawRequest`) only with the key, and a new publish under that
identity only naming the same owner (or once the record has expired).

**Bounds.** Each entry is at most :data:`MAX_ENTRY_BYTES` and all live entries
together at most :data:`MAX_REGISTRY_BYTES` (its compact JSON, as
:func:`entry_bytes` counts it): every reader holds and parses all of them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aiworker.schemas.base import Model
from aiworker.schemas.messages import json_path
from aiworker.schemas.spec import WorkerSpec

# major.minor: a reader reads entries of its own major version (a minor adds fields;
# 1.1: `signature`).
REGISTRY_PROTOCOL: Final = "1.1"
# Bounds the registry workflow applies to what it is sent (its update validator):
# processes listed, one entry's bytes, and every live entry's bytes together. The
# total is what every reader and the worker hosting the registry hold parsed (several
# times its JSON size), and the `entries` query answers it in one payload: Temporal
# refuses a payload over its blob-size limit (2 MB by default, on the dev server and
# Temporal Cloud) by failing the registry's workflow task, so the total stays under
# it with room for the records around the entries. A full entry (every built-in, with
# examples) is about 25 KB: some 60 such processes.
MAX_PROCESSES: Final = 500
MAX_ENTRY_BYTES: Final = 1_000_000
MAX_REGISTRY_BYTES: Final = 1_500_000
MIN_TTL_SECONDS: Final = 1.0
MAX_TTL_SECONDS: Final = 86_400.0


SIGNATURE_FIELD: Final = "signature"
_SIGNATURE_SCHEME = "hmac-sha256:"
# What the MAC covers starts with this, so the deployment secret signs nothing else
# that could pass for an entry.
_SIGNED_PREFIX = b"aiworker-registry-entry\n"
OWNER_FIELD: Final = "owner"
_OWNER = re.compile(r"[0-9a-f]{64}")


def entry_bytes(entry: Mapping[str, Any]) -> int:
    """The size the registry counts of an entry: its compact JSON."""
    return len(json.dumps(entry, separators=(",", ":")))


def _canonical(raw: Mapping[str, Any]) -> bytes:
    doc = {k: v for k, v in raw.items() if k != SIGNATURE_FIELD}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _SIGNED_PREFIX + text.encode()


def entry_signature(raw: Mapping[str, Any], secret: bytes) -> str:
    """``hmac-sha256:<hex>`` of ``raw``'s canonical JSON (sorted keys, no spaces,
    without its ``signature``) under ``secret``."""
    return _SIGNATURE_SCHEME + hmac.new(secret, _canonical(raw), hashlib.sha256).hexdigest()


def sign_entry(raw: Mapping[str, Any], secret: bytes | None) -> dict[str, Any]:
    """``raw`` with its ``signature`` under ``secret``; unsigned without a secret."""
    doc = {k: v for k, v in raw.items() if k != SIGNATURE_FIELD}
    if secret is not None:
        doc[SIGNATURE_FIELD] = entry_signature(doc, secret)
    return doc


def signature_ok(raw: Mapping[str, Any], secret: bytes) -> bool:
    """Whether ``raw`` carries the signature ``secret`` gives it (in constant time)."""
    given = raw.get(SIGNATURE_FIELD)
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode(), entry_signature(raw, secret).encode())


def owner_of(key: str) -> str:
    """The owner hash an entry names for the withdraw key ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def owner_named(entry: Mapping[str, Any]) -> str | None:
    """The owner hash ``entry`` names (its ``owner``: 64 lowercase hex digits), or None."""
    owner = entry.get(OWNER_FIELD)
    return owner if isinstance(owner, str) and _OWNER.fullmatch(owner) else None


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
    published again.

    The entry's ``owner`` (:func:`owner_named`: the sha256 of a key only the
    publishing process holds) makes the record its own: while it lives, only a
    publish naming the same owner replaces it and only a withdraw with the key
    removes it. An entry naming none (a publisher of an earlier build) anyone
    may replace or withdraw. The owner travels inside the entry, which every
    build takes as plain JSON, so a process of this build publishes to a
    registry still running an earlier one.
    """

    identity: str = Field(min_length=1, max_length=255)
    ttl_seconds: float = Field(ge=MIN_TTL_SECONDS, le=MAX_TTL_SECONDS, allow_inf_nan=False)
    entry: dict[str, Any]


class WithdrawRequest(Model):
    """The ``withdraw`` signal of a publisher that named an owner: its identity and
    the key whose sha256 it named (earlier publishers send the identity alone)."""

    identity: str = Field(min_length=1, max_length=255)
    key: str = Field(min_length=1, max_length=255)


class RegistryRecord(Model):
    """A published entry and the times (epoch seconds, workflow time) it was
    published and expires."""

    entry: dict[str, Any]
    published_at: float
    expires_at: float


class RegistryState(Model):
    """The registry workflow's state, carried across continue-as-new."""

    records: dict[str, RegistryRecord] = Field(default_factory=dict)
    # kept apart from the records: the `entries` query answers records, and a
    # client of an earlier build refuses a record with a field it does not know
    owners: dict[str, str] = Field(default_factory=dict)


class RegistrySnapshot(Model):
    """The ``entries`` query's answer: every live record, by identity, and the
    workflow's time when it answered."""

    records: dict[str, RegistryRecord]
    now: float


def _first_error(e: ValidationError) -> str:
    first = e.errors()[0]
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{json_path(first['loc'])}: {first['msg']}{more}"


def parse_entry(
    identity: str, raw: Any, secret: bytes | None = None
) -> tuple[ProcessEntry | None, str | None]:
    """``raw`` as a :class:`ProcessEntry`, or None and a warning naming the process.

    Validated whole, so that what a reader goes on to do with an entry cannot
    fail on it. Ignored: with ``secret``, an entry without the signature it gives
    (unsigned, signed with another secret, or changed since); an entry of another
    major protocol version; one that fails the model; one whose identity is not
    the one it was published under; one whose workers' specs fail
    :class:`WorkerSpec` (version included) or do not match their id, hash,
    version, task queue, kind or execution. Without ``secret`` nothing is
    authenticated: callers must not use what it serves (``LiveRegistry.trusted``).
    """
    where = f"registry entry of process {identity!r}"
    if not isinstance(raw, dict):
        return None, f"ignoring the {where}: not a JSON object"
    if secret is not None and not signature_ok(raw, secret):
        why = "unsigned" if SIGNATURE_FIELD not in raw else "its signature does not match"
        return None, (
            f"ignoring the {where}: {why} (not signed with this deployment's "
            "AIWORKER_REGISTRY_SECRET)"
        )
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
        listed = (w.version, w.task_queue, w.kind, w.execution)
        if listed != (spec.version, spec.task_queue, spec.kind, spec.execution):
            return None, (
                f"ignoring the malformed {where}: worker {w.worker_id!r}: its version, task "
                "queue, kind or execution differs from its spec's"
            )
    return entry, None


__all__ = [
    "MAX_ENTRY_BYTES",
    "MAX_PROCESSES",
    "MAX_REGISTRY_BYTES",
    "OWNER_FIELD",
    "REGISTRY_PROTOCOL",
    "SIGNATURE_FIELD",
    "ModelAliasEntry",
    "ProcessEntry",
    "PublishRequest",
    "RegistryRecord",
    "RegistrySnapshot",
    "RegistryState",
    "ServedWorker",
    "WithdrawRequest",
    "entry_bytes",
    "entry_signature",
    "owner_named",
    "owner_of",
    "parse_entry",
    "sign_entry",
    "signature_ok",
    "spec_hash",
]
