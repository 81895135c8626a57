"""The step cache: a worker's succeeded result reused across runs, for a TTL.

A step that declares ``cache: {"ttl_seconds": N}`` sends that policy in its
:class:`~aiworker.schemas.protocol.WorkerRequest`. The worker runtime looks
the call up *inside the activity*, after the request, the tenant and the
input have been checked and before the worker runs:

- **key**: sha256 of the canonical JSON (sorted keys, no whitespace, UTF-8)
  of the worker id, its spec version, the sha256 of the whole spec
  (:func:`spec_hash`: a prompt, model alias or ``output_schema`` changed
  without a new ``version`` is another key), the resolved model (provider,
  endpoint and model name behind an llm-call's or a prompt worker's alias:
  the same alias pointed at another model is another key), the tenant and
  the sha256 of the canonical resolved input (:func:`cache_key`). A for_each item is one call,
  so each item has its own key; a validation retry carries the validator's
  reasons in its input, so it has another key than the attempt it repeats.
- **hit**: an entry younger than the request's TTL whose outputs the current
  ``output_schema`` still accepts (the runtime checks; one it refuses is a
  miss, logged as ``step cache hit refused`` and counted in
  :attr:`StepCache.refused`). The response is built
  from it with ``cached: true``, no usage (no external call, no token:
  nothing counts toward the budget) and this attempt's observability.
- **miss**: the worker runs; a ``succeeded`` response is stored (``partial``
  results and failures never are). A store that fails is logged and the
  call still succeeds: the cache is an optimisation, never a new way to fail.

Why inside the activity: a step without ``cache`` pays nothing (no extra
activity, history event or round trip: the request carries ``"cache":
null``), and a cached step costs one activity either way, its outputs in
the history exactly as a fresh result's, so ``steps.<id>.outputs`` and
replay work unchanged. The price is that a hit still goes through the
workflow's limiter first (it takes a rate or concurrency permit like any
call): deciding a hit before the limiter would need a lookup activity, one
more round trip on every cached step, to save a permit that is held only for
the time of one read. The budget does not count a hit (its usage is zero),
though the ledger's admission still runs before the call.

Entries live beside the artifacts, in the store ``AIWORKER_ARTIFACT_STORE``
names, scoped by tenant the same way (:func:`~aiworker.activities.artifacts.tenant_dir`):

- ``file``: ``<data_dir>/cache/<tenant>/<key[:2]>/<key>.json``, written
  atomically; the file's modification time is set to the entry's expiry, so
  each store prunes its shard's expired entries from a ``stat`` alone;
- ``s3://bucket/prefix``: ``<prefix>/_cache/<tenant>/<key[:2]>/<key>.json``
  (no tenant name starts with ``_``); each store deletes the shard's objects
  older than the longest TTL (30 days); a bucket lifecycle rule on
  ``<prefix>/_cache/`` does the same without requests.

An entry is overwritten whenever its key is stored again (after it expired,
or by a run with a shorter TTL), so the store holds one entry per key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import Field

from aiworker.activities.artifacts import atomic_write, tenant_dir
from aiworker.activities.errors import InvalidInputError
from aiworker.schemas.base import Model
from aiworker.schemas.protocol import (
    MAX_CACHE_TTL_SECONDS,
    ArtifactRef,
    WarningInfo,
    WorkerRequest,
    WorkerResponse,
)
from aiworker.schemas.spec import WorkerSpec
from aiworker.schemas.step_inputs import cache_refusal

if TYPE_CHECKING:
    # The AWS SDK loads only in processes configured for S3.
    from types_aiobotocore_s3.type_defs import ObjectIdentifierTypeDef

    from aiworker.activities.artifacts_s3 import S3Connection

log = logging.getLogger("aiworker.step_cache")

# The entry format; an entry of another format is a miss (and overwritten).
_FORMAT = 1
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}


def canonical_json(value: Any) -> bytes:
    """``value`` as canonical JSON: sorted keys, no whitespace, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def spec_hash(spec: WorkerSpec) -> str:
    """sha256 of the spec as the worker runs it (its ``examples`` left out: they
    change no answer)."""
    return hashlib.sha256(
        canonical_json(spec.model_dump(mode="json", exclude={"examples"}))
    ).hexdigest()


def cache_key(
    worker_id: str,
    version: str,
    tenant: str,
    worker_input: Any,
    spec: str = "",
    model: str = "",
) -> str:
    """The cache key of one call: worker, spec version, spec hash (:func:`spec_hash`),
    resolved model, tenant and resolved input."""
    input_hash = hashlib.sha256(canonical_json(worker_input)).hexdigest()
    doc = {
        "worker_id": worker_id,
        "version": version,
        "spec": spec,
        "model": model,
        "tenant": tenant,
        "input": input_hash,
    }
    return hashlib.sha256(canonical_json(doc)).hexdigest()


class CachedResult(Model):
    """What an entry keeps of a response: the rest is the new attempt's own."""

    outputs: dict[str, Any] = Field(default_factory=dict)
    warnings: list[WarningInfo] = Field(default_factory=list)
    artifacts: list[ArtifactRef] = Field(default_factory=list)


class CacheBackend(Protocol):
    """Where entries live: raw bytes by tenant and key."""

    async def read(self, tenant: str, key: str) -> bytes | None:
        """The entry stored under ``key`` for ``tenant``, or None."""
        ...

    async def write(self, tenant: str, key: str, data: bytes, *, now: float, ttl: int) -> None:
        """Store (or overwrite) the entry, stored ``now`` for ``ttl`` seconds, and
        prune expired ones nearby."""
        ...


class FileCacheBackend:
    """Entries under ``<root>/<area>/<tenant>/<key[:2]>/<key>.json``.

    Args:
        root: the data directory (``settings.data_dir``).
        area: the directory under ``root`` (``cache`` for the step cache; other
            stores of the same shape keep their own).
        max_per_shard: keep at most this many entries in a shard, dropping those
            that expire first (None: no count bound); 256 shards per tenant make
            the tenant's bound.
    """

    def __init__(
        self, root: Path, *, area: str = "cache", max_per_shard: int | None = None
    ) -> None:
        self.base = (Path(root) / area).resolve()
        self.max_per_shard = max_per_shard

    def path_for(self, tenant: str, key: str) -> Path:
        """The file of ``key`` for ``tenant``."""
        return self.base / tenant_dir(tenant) / key[:2] / f"{key}.json"

    async def read(self, tenant: str, key: str) -> bytes | None:
        path = self.path_for(tenant, key)
        if not path.is_file():
            # A miss is one stat on the event loop: cheaper than the hop to a thread,
            # and every first scrape of a page (most of a crawl) is one.
            return None
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None

    async def write(self, tenant: str, key: str, data: bytes, *, now: float, ttl: int) -> None:
        await asyncio.to_thread(self._write, self.path_for(tenant, key), data, now, now + ttl)

    def _write(self, path: Path, data: bytes, now: float, expires_at: float) -> None:
        atomic_write(path, data)
        # The mtime is the expiry: pruning needs a stat, never a read.
        os.utime(path, (expires_at, expires_at))
        live: list[tuple[float, Path]] = []
        for other in path.parent.glob("*.json"):
            with contextlib.suppress(OSError):  # another process may prune it first
                expiry = other.stat().st_mtime
                if expiry <= now:
                    other.unlink()
                elif other != path:
                    live.append((expiry, other))
        if self.max_per_shard is not None and len(live) >= self.max_per_shard:
            live.sort(reverse=True)
            for _, other in live[self.max_per_shard - 1 :]:
                with contextlib.suppress(OSError):
                    other.unlink()


@dataclass
class S3CacheBackend:
    """Entries at ``<prefix>/<area>/<tenant>/<key[:2]>/<key>.json`` in the artifact
    bucket, through the artifact store's S3 client (its ``connection``).

    ``area`` starts with ``_`` (no tenant name does); ``max_per_shard`` as for
    :class:`FileCacheBackend`, the oldest objects going first.
    """

    connection: S3Connection
    bucket: str
    prefix: str = ""
    area: str = "_cache"
    max_per_shard: int | None = None

    def key_for(self, tenant: str, key: str) -> str:
        """The object key of ``key`` for ``tenant``."""
        parts = (self.prefix.strip("/"), self.area, tenant_dir(tenant), key[:2], f"{key}.json")
        return "/".join(p for p in parts if p)

    async def read(self, tenant: str, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        s3 = await self.connection.client()
        try:
            resp = await s3.get_object(Bucket=self.bucket, Key=self.key_for(tenant, key))
            async with resp["Body"] as body:
                data: bytes = await body.read()
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code")) in _NOT_FOUND:
                return None
            raise
        return data

    async def write(self, tenant: str, key: str, data: bytes, *, now: float, ttl: int) -> None:
        s3 = await self.connection.client()
        object_key = self.key_for(tenant, key)
        await s3.put_object(
            Bucket=self.bucket, Key=object_key, Body=data, ContentType="application/json"
        )
        # Listing gives no metadata, only the age: prune what no TTL can still use.
        shard = object_key.rsplit("/", 1)[0] + "/"
        page = await s3.list_objects_v2(Bucket=self.bucket, Prefix=shard)
        oldest = now - MAX_CACHE_TTL_SECONDS
        others = sorted(
            (o for o in page.get("Contents", []) if o["Key"] != object_key),
            key=lambda o: o["LastModified"],
            reverse=True,
        )
        keep = len(others) if self.max_per_shard is None else self.max_per_shard - 1
        stale: list[ObjectIdentifierTypeDef] = [
            {"Key": o["Key"]}
            for i, o in enumerate(others)
            if i >= keep or o["LastModified"].timestamp() < oldest
        ]
        if stale:
            await s3.delete_objects(Bucket=self.bucket, Delete={"Objects": stale})


def backend_beside(
    artifact_store: Any, data_dir: Path, *, area: str = "cache", max_per_shard: int | None = None
) -> CacheBackend:
    """Entries in the same place as ``artifact_store`` (the ``artifact_store`` tool,
    possibly wrapped for lineage): its S3 bucket and prefix (under ``_<area>``),
    else the data directory (under ``<area>``)."""
    store = getattr(artifact_store, "store", artifact_store)
    connection = getattr(store, "connection", None)
    bucket = getattr(store, "bucket", None)
    if connection is not None and isinstance(bucket, str):
        prefix = getattr(store, "prefix", "")
        return S3CacheBackend(connection, bucket, prefix, f"_{area}", max_per_shard)
    return FileCacheBackend(data_dir, area=area, max_per_shard=max_per_shard)


class StepCache:
    """Looks calls up and stores their results (see the module docstring).

    Args:
        backend: where the entries live.
        clock: POSIX seconds now (tests may pass their own).
    """

    refused: int = 0
    """Hits refused because the current ``output_schema`` rejects their outputs."""

    def __init__(self, backend: CacheBackend, clock: Any = time.time) -> None:
        self.backend = backend
        self.clock = clock

    @classmethod
    def beside(cls, artifact_store: Any, data_dir: Path) -> StepCache:
        """The cache in the same place as ``artifact_store`` (see :func:`backend_beside`)."""
        return cls(backend_beside(artifact_store, data_dir))

    @staticmethod
    def key(request: WorkerRequest, spec: WorkerSpec, model: str = "") -> str:
        """The key of ``request`` to ``spec``'s worker with ``model`` resolved."""
        return cache_key(
            request.worker_id, spec.version, request.tenant, request.input, spec_hash(spec), model
        )

    def refuse(self, key: str, why: str) -> None:
        """Count and log a hit the current ``output_schema`` rejects (it is a miss)."""
        self.refused += 1
        log.warning("step cache hit refused: %s", why, extra={"cache_key": key})

    async def lookup(
        self, request: WorkerRequest, spec: WorkerSpec, model: str = ""
    ) -> CachedResult | None:
        """The stored result of this call if one is younger than the request's TTL.

        Raises:
            InvalidInputError: the request asks a worker that may not be cached
                (side effects) for a cache.
        """
        policy = request.cache
        if policy is None:
            return None
        why = cache_refusal(spec)
        if why is not None:
            raise InvalidInputError(why, field="cache")
        key = self.key(request, spec, model)
        try:
            raw = await self.backend.read(request.tenant, key)
            entry = json.loads(raw) if raw is not None else None
        except Exception as e:  # an unreadable entry is a miss, not a failed call
            log.warning("step cache read failed: %s", e, extra={"cache_key": key})
            return None
        if not isinstance(entry, dict) or entry.get("format") != _FORMAT:
            return None
        stored_at = entry.get("stored_at")
        if entry.get("key") != key or not isinstance(stored_at, (int, float)):
            return None
        if self.clock() - stored_at >= policy.ttl_seconds:
            return None  # expired: the next store overwrites it
        try:
            return CachedResult.model_validate(entry.get("result"))
        except ValueError:  # a damaged entry is a miss (and overwritten)
            return None

    async def store(
        self, request: WorkerRequest, response: WorkerResponse, spec: WorkerSpec, model: str = ""
    ) -> None:
        """Keep a ``succeeded`` response of a cached call; anything else is not kept."""
        policy = request.cache
        if policy is None or response.status != "succeeded":
            return
        key = self.key(request, spec, model)
        now = self.clock()
        entry = {
            "format": _FORMAT,
            "key": key,
            "worker_id": response.worker_id,
            "version": response.version,
            "stored_at": now,
            "expires_at": now + policy.ttl_seconds,
            "result": response.model_dump(
                mode="json", include={"outputs", "warnings", "artifacts"}
            ),
        }
        try:
            await self.backend.write(
                request.tenant, key, canonical_json(entry), now=now, ttl=policy.ttl_seconds
            )
        except Exception as e:  # the result stands; only its reuse is lost
            log.warning("step cache write failed: %s", e, extra={"cache_key": key})


__all__ = [
    "CacheBackend",
    "CachedResult",
    "FileCacheBackend",
    "S3CacheBackend",
    "StepCache",
    "backend_beside",
    "cache_key",
    "canonical_json",
    "spec_hash",
]
