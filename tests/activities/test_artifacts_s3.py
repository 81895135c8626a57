"""The S3 artifact store and lineage against a real S3-compatible server (moto) on loopback."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import pytest
from fixtures.s3 import MotoS3, bucket, conn, moto_s3  # noqa: F401  (fixtures)

from aiworker.activities import lineage
from aiworker.activities.artifacts_s3 import (
    S3ArtifactStore,
    S3Connection,
    S3LineageIndex,
    parse_s3_url,
)
from aiworker.activities.errors import AccessDeniedError, InvalidInputError, NotFoundError
from aiworker.activities.lineage import RecordingArtifactStore
from aiworker.schemas.errors import ErrorCode


def objects(moto_s3: MotoS3, bucket: str, prefix: str) -> list[dict[str, Any]]:
    page = moto_s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return list(page.get("Contents", []))


def test_parse_s3_url() -> None:
    assert parse_s3_url("s3://b-1/a/b/") == ("b-1", "a/b")
    assert parse_s3_url("s3://bucket") == ("bucket", "")
    with pytest.raises(ValueError):
        parse_s3_url("s3:///x")
    with pytest.raises(ValueError):
        parse_s3_url("file:///x")


async def test_round_trip_content_addressed_and_tenant_scoped(
    moto_s3: MotoS3,
    bucket: str,
    conn: S3Connection,
) -> None:
    store = S3ArtifactStore(conn, bucket, "aw/arts")
    body = b"<html>hello</html>"
    digest = hashlib.sha256(body).hexdigest()
    ref = await store.put("acme", body, "text/html")
    key = f"aw/arts/acme/{digest[:2]}/{digest}"
    assert ref.uri == f"s3://{bucket}/{key}"
    assert (ref.sha256, ref.size_bytes, ref.media_type) == (digest, len(body), "text/html")
    assert await store.get("acme", ref) == body
    assert await store.get("acme", ref.uri) == body
    head = moto_s3.client().head_object(Bucket=bucket, Key=key)
    assert head["ContentType"] == "text/html"
    assert head["Metadata"] == {"sha256": digest, "tenant": "acme"}

    # Dedupe: the same bytes of one tenant are one object; another tenant gets its own.
    again = await store.put("acme", body, "text/html")
    assert again == ref
    assert [o["Key"] for o in objects(moto_s3, bucket, "aw/arts/acme/")] == [key]
    other = await store.put("globex", body, "text/html")
    assert other.uri != ref.uri and other.sha256 == ref.sha256
    assert len(objects(moto_s3, bucket, "aw/arts/")) == 2


async def test_cross_tenant_reads_are_refused(bucket: str, conn: S3Connection) -> None:
    store = S3ArtifactStore(conn, bucket, "aw")
    ref = await store.put("acme", b"secret of acme")
    with pytest.raises(AccessDeniedError) as e:
        await store.get("globex", ref)
    assert e.value.code == ErrorCode.ACCESS_DENIED
    digest = ref.sha256
    with pytest.raises(AccessDeniedError):  # dot-dot out of one's own prefix
        await store.get("globex", f"s3://{bucket}/aw/globex/../acme/{digest[:2]}/{digest}")
    # a store this process does not have is not a question of tenancy: it names the store
    for uri in (
        f"s3://other-bucket/aw/globex/{digest[:2]}/{digest}",
        f"s3://{bucket}/acme/{digest[:2]}/{digest}",  # outside the configured prefix
    ):
        with pytest.raises(
            NotFoundError, match=f"not in this process's artifact store \\(s3://{bucket}/aw/"
        ):
            await store.get("globex", uri)
    # A tenant whose name is a prefix of another's is still another tenant.
    with pytest.raises(AccessDeniedError):
        await store.get("acm", ref)
    with pytest.raises(InvalidInputError):
        await store.get("globex", f"file:///aw/globex/{digest[:2]}/{digest}")
    with pytest.raises(InvalidInputError):
        await store.get("acme", f"s3://{bucket}/aw/acme/_lineage/x.json")
    missing = "0" * 64
    with pytest.raises(NotFoundError):
        await store.get("acme", f"s3://{bucket}/aw/acme/00/{missing}")


async def test_large_bodies_upload_in_parts(
    moto_s3: MotoS3,
    bucket: str,
    conn: S3Connection,
) -> None:
    mib = 1024 * 1024
    store = S3ArtifactStore(
        conn, bucket, "big", multipart_threshold=5 * mib, multipart_chunk=5 * mib
    )
    body = bytes(range(256)) * (6 * mib // 256 + 7)
    ref = await store.put("acme", body, "application/octet-stream")
    key = ref.uri.split(f"s3://{bucket}/", 1)[1]
    etag = moto_s3.client().head_object(Bucket=bucket, Key=key)["ETag"]
    assert etag.strip('"').endswith("-2"), etag  # a two-part multipart upload
    assert await store.get("acme", ref) == body


async def test_lineage_recorded_per_use_in_s3(bucket: str, conn: S3Connection) -> None:
    index = S3LineageIndex(conn, bucket, "lin")
    store = RecordingArtifactStore(S3ArtifactStore(conn, bucket, "lin"), index)
    wf = f"wf/{uuid.uuid4().hex[:6]}"
    await store.put("acme", b"outside any worker call")  # nothing to attribute it to
    for attempt in (1, 2):
        call = lineage.CallLineage(
            tenant="acme",
            worker_id="web-scrape",
            workflow_id=wf,
            step_id=lineage.step_of(f"{wf}/scrape/3", wf),
            attempt=attempt,
            trace_id="ab" * 16,
            idempotency_key=f"{wf}/scrape/3",
        )
        with lineage.bound(call):
            ref = await store.put("acme", b"page", "text/html")
            await store.put("acme", b"page", "text/html")  # the same use twice: one record
    records = await index.records(wf)
    assert [(r.step_id, r.attempt) for r in records] == [("scrape/3", 1), ("scrape/3", 2)]
    r = records[0]
    assert (r.uri, r.sha256, r.size_bytes, r.media_type) == (
        ref.uri,
        ref.sha256,
        4,
        "text/html",
    )
    assert (r.tenant, r.worker_id, r.workflow_id, r.trace_id) == (
        "acme",
        "web-scrape",
        wf,
        "ab" * 16,
    )
    assert await index.records("no-such-workflow") == []
    # a for_each item runs in the chunk workflow <wf>/<step>/<n>: listed with children
    chunk = lineage.CallLineage(
        "acme", "web-scrape", f"{wf}/each/0", "each", 1, None, f"{wf}/each/4"
    )
    with lineage.bound(chunk):
        await store.put("acme", b"item", "text/html")
    assert len(await index.records(wf)) == 2
    with_items = await index.records(wf, children=True)
    assert [r.workflow_id for r in with_items] == [wf, wf, f"{wf}/each/0"]
    assert lineage.current() is None
