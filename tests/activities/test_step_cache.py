"""The step cache's store on a real file system and a real S3-compatible server
(moto on loopback): keys, TTL, what is stored, damaged entries, pruning."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures.s3 import MotoS3, bucket, conn, moto_s3  # noqa: F401  (fixtures)
from support.cache_workers import Echo

from aiworker.activities.artifacts import FileArtifactStore
from aiworker.activities.artifacts_s3 import S3ArtifactStore, S3Connection
from aiworker.activities.errors import InvalidInputError
from aiworker.activities.lineage import FileLineageIndex, RecordingArtifactStore
from aiworker.activities.step_cache import (
    FileCacheBackend,
    S3CacheBackend,
    StepCache,
    cache_key,
    canonical_json,
    spec_hash,
)
from aiworker.config.catalog import builtin_spec
from aiworker.schemas import names
from aiworker.schemas.protocol import Observability, WorkerRequest, WorkerResponse
from aiworker.schemas.spec import WorkerSpec

SPEC: WorkerSpec = Echo.spec


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _request(text: str = "hi", tenant: str = "acme", ttl: int | None = 60) -> WorkerRequest:
    return WorkerRequest.model_validate(
        {
            "worker_id": "cache-echo",
            "version": "1.0.0",
            "idempotency_key": "wf/step",
            "tenant": tenant,
            "input": {"text": text, "n": [1, {"b": 2, "a": 1}]},
            "cache": None if ttl is None else {"ttl_seconds": ttl},
        }
    )


def _response(status: str = "succeeded", reply: str = "hi") -> WorkerResponse:
    return WorkerResponse.model_validate(
        {
            "worker_id": "cache-echo",
            "version": "1.0.0",
            "status": status,
            "outputs": {"reply": reply},
            "warnings": [{"code": "w", "message": "kept"}],
            "usage": {"external_calls": 3},
            "observability": Observability(worker_id="cache-echo").model_dump(),
        }
    )


def test_the_key_is_canonical_and_covers_worker_version_tenant_and_input() -> None:
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"é"],"b":1}'.encode()
    key = cache_key("w", "1", "acme", {"a": 1, "b": 2})
    assert key == cache_key("w", "1", "acme", {"b": 2, "a": 1})
    others = [
        cache_key("v", "1", "acme", {"a": 1, "b": 2}),
        cache_key("w", "2", "acme", {"a": 1, "b": 2}),
        cache_key("w", "1", "other", {"a": 1, "b": 2}),
        cache_key("w", "1", "acme", {"a": 1, "b": 3}),
    ]
    assert key not in others and len(set(others)) == 4
    # issue 31: the spec's hash and the resolved model are part of the key, so a prompt,
    # model or output_schema changed without a new version is another key
    assert cache_key("w", "1", "acme", {"a": 1, "b": 2}, spec="s1") != cache_key(
        "w", "1", "acme", {"a": 1, "b": 2}, spec="s2"
    )
    assert cache_key("w", "1", "acme", {}, model="openai x gpt-a") != cache_key(
        "w", "1", "acme", {}, model="openai x gpt-b"
    )
    revised = SPEC.model_copy(update={"output_schema": {"type": "object"}})
    assert spec_hash(revised) != spec_hash(SPEC)
    assert spec_hash(SPEC.model_copy(update={"examples": []})) == spec_hash(SPEC)


async def test_a_stored_result_is_reused_until_its_ttl(tmp_path: Path) -> None:
    clock = Clock()
    cache = StepCache(FileCacheBackend(tmp_path), clock=clock)
    assert await cache.lookup(_request(), SPEC) is None
    await cache.store(_request(), _response(), SPEC)
    hit = await cache.lookup(_request(), SPEC)
    assert hit is not None
    assert hit.outputs == {"reply": "hi"}
    assert [w.message for w in hit.warnings] == ["kept"]
    # another tenant, input or spec version is another key
    assert await cache.lookup(_request(tenant="other"), SPEC) is None
    assert await cache.lookup(_request(text="ho"), SPEC) is None
    assert await cache.lookup(_request(), SPEC.model_copy(update={"version": "1.1.0"})) is None
    clock.now += 59.9
    assert await cache.lookup(_request(), SPEC) is not None
    clock.now += 0.1
    assert await cache.lookup(_request(), SPEC) is None  # 60 s old: expired


async def test_only_succeeded_results_of_cached_calls_are_stored(tmp_path: Path) -> None:
    cache = StepCache(FileCacheBackend(tmp_path))
    await cache.store(_request(), _response(status="partial"), SPEC)
    await cache.store(_request(ttl=None), _response(), SPEC)
    assert not (tmp_path / "cache").exists()


async def test_a_worker_with_side_effects_refuses_a_cache(tmp_path: Path) -> None:
    cache = StepCache(FileCacheBackend(tmp_path))
    with pytest.raises(InvalidInputError) as ei:
        await cache.lookup(_request(), builtin_spec(names.PUBLISH))
    assert ei.value.field == "cache"
    assert "worker 'publish' has side effects" in str(ei.value)


async def test_an_external_worker_refuses_a_cache(tmp_path: Path) -> None:
    external = WorkerSpec.model_validate(
        {
            **SPEC.model_dump(mode="json", by_alias=True, exclude_unset=True),
            "worker_id": "ext",
            "implementation": {"kind": "external"},
        }
    )
    with pytest.raises(InvalidInputError, match="worker 'ext' is external"):
        await StepCache(FileCacheBackend(tmp_path)).lookup(_request(), external)


async def test_a_damaged_entry_is_a_miss_and_is_overwritten(tmp_path: Path) -> None:
    backend = FileCacheBackend(tmp_path)
    cache = StepCache(backend)
    req = _request()
    path = backend.path_for("acme", StepCache.key(req, SPEC))
    path.parent.mkdir(parents=True)
    for junk in (b"{not json", b"[]", b'{"format": 1, "key": "x", "stored_at": 0}'):
        path.write_bytes(junk)
        assert await cache.lookup(req, SPEC) is None
    await cache.store(req, _response(), SPEC)
    assert await cache.lookup(req, SPEC) is not None


async def test_a_store_prunes_the_expired_entries_of_its_shard(tmp_path: Path) -> None:
    backend = FileCacheBackend(tmp_path)
    old, live = "ab" + "0" * 62, "ab" + "1" * 62
    await backend.write("acme", old, b"{}", now=time.time() - 61, ttl=60)
    await backend.write("acme", live, b"{}", now=time.time(), ttl=600)
    assert not backend.path_for("acme", old).exists()
    assert backend.path_for("acme", live).exists()
    # the file's mtime is its expiry
    assert os.stat(backend.path_for("acme", live)).st_mtime > time.time() + 500


async def test_the_cache_sits_beside_the_artifact_store(tmp_path: Path) -> None:
    store = RecordingArtifactStore(FileArtifactStore(tmp_path), FileLineageIndex(tmp_path))
    cache = StepCache.beside(store, tmp_path)
    assert isinstance(cache.backend, FileCacheBackend)
    assert cache.backend.base == (tmp_path / "cache").resolve()


# --- S3 -----------------------------------------------------------------------------


async def test_s3_entries_beside_the_artifacts_scoped_by_tenant(
    moto_s3: MotoS3, bucket: str, conn: S3Connection
) -> None:
    store = RecordingArtifactStore(S3ArtifactStore(conn, bucket, "art"), FileLineageIndex(Path()))
    cache = StepCache.beside(store, Path("/nonexistent"))
    assert isinstance(cache.backend, S3CacheBackend)
    assert await cache.lookup(_request(), SPEC) is None
    await cache.store(_request(), _response(), SPEC)
    hit = await cache.lookup(_request(), SPEC)
    assert hit is not None and hit.outputs == {"reply": "hi"}
    assert await cache.lookup(_request(tenant="other"), SPEC) is None
    keys = _keys(moto_s3, bucket, "art/_cache/")
    key = StepCache.key(_request(), SPEC)
    assert keys == [f"art/_cache/acme/{key[:2]}/{key}.json"]


def _keys(moto_s3: MotoS3, bucket: str, prefix: str) -> list[Any]:
    page = moto_s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for o in page.get("Contents", [])]
