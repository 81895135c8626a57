"""The S3-compatible artifact store (``s3://bucket/prefix``).

Same contract as :class:`~activities.artifacts.FileArtifactStore`:
content-addressed and tenant-scoped, with keys
``<prefix>/<tenant>/<sha256[:2]>/<sha256>``. A put first asks whether the key
exists (the same bytes of one tenant are uploaded once); a body over the
multipart threshold is uploaded in parts, so no
single request carries the whole body (see :func:`upload`). A get checks that the key lies under
the caller's own tenant prefix before any request is made
(``access_denied`` otherwise) and verifies the content hash.

Endpoint, region and credentials come from the AWS SDK's own configuration
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, profiles, instance roles); the process passes
``AWS_REGION`` in as ``region_name``. The SDK's own retries are off: Temporal
retries the activity.

:class:`S3Connection` opens one aioboto3 client lazily, on the event loop that
first needs it, and is shared by the artifact store, the lineage index and
the SDK's external-storage driver of one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import aioboto3
from botocore.config import Config
from botocore.exceptions import ClientError

from aiworker.activities.artifacts import tenant_dir
from aiworker.activities.errors import AccessDeniedError, InvalidInputError, NotFoundError
from aiworker.activities.lineage import MAX_RECORDS, ArtifactRecord, sort_records, workflow_segment
from aiworker.schemas.protocol import ArtifactRef

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef

# S3 refuses parts under 5 MiB (except the last); 8 MiB is the AWS CLI default.
MULTIPART_THRESHOLD = 8 * 1024 * 1024
MULTIPART_CHUNK = 8 * 1024 * 1024
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]{1,254}$")


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``."""
    if not url.startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url!r}")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not _BUCKET.match(bucket):
        raise ValueError(f"{url!r}: {bucket!r} is not a bucket name")
    return bucket, prefix.strip("/")


async def upload(
    s3: S3Client,
    bucket: str,
    key: str,
    data: bytes,
    *,
    content_type: str = "application/octet-stream",
    metadata: Mapping[str, str] | None = None,
    multipart_threshold: int = MULTIPART_THRESHOLD,
    part_size: int = MULTIPART_CHUNK,
) -> None:
    """Upload ``data``: one request below the threshold, else a multipart upload.

    Bodies go to the HTTP client as streams, which aiohttp writes in chunks
    (a multi-megabyte ``bytes`` body is one write that can hold the event
    loop). Parts go one at a time, so at most one part is copied at once; a
    failed multipart upload is aborted.
    """
    extra: dict[str, Any] = {"ContentType": content_type, "Metadata": dict(metadata or {})}
    view = memoryview(data)
    if len(data) < multipart_threshold:
        await s3.put_object(Bucket=bucket, Key=key, Body=io.BytesIO(view), **extra)
        return
    upload_id = (await s3.create_multipart_upload(Bucket=bucket, Key=key, **extra))["UploadId"]
    try:
        parts: list[CompletedPartTypeDef] = []
        for number, start in enumerate(range(0, len(data), part_size), start=1):
            chunk = io.BytesIO(view[start : start + part_size])
            resp = await s3.upload_part(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=chunk,
            )
            parts.append({"ETag": resp["ETag"], "PartNumber": number})
        await s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise


def _error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


class S3Connection:
    """One aioboto3 S3 client per process, opened on first use.

    Args:
        region_name: overrides the SDK's region resolution (``AWS_REGION``).
        client_kwargs: more arguments for ``session.client("s3", ...)``
            (tests: ``endpoint_url`` and credentials).
    """

    def __init__(
        self, *, region_name: str | None = None, client_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        self._kwargs: dict[str, Any] = dict(client_kwargs or {})
        if region_name:
            self._kwargs.setdefault("region_name", region_name)
        self._kwargs.setdefault(
            "config",
            Config(retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=60),
        )
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: S3Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    async def client(self) -> S3Client:
        """The open client (aiohttp sessions belong to one event loop)."""
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        if self._lock is None or self._loop is not loop:
            self._lock = asyncio.Lock()
            self._loop = loop
            self._client = None
            self._stack = None
        async with self._lock:
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                session = aioboto3.Session()
                self._client = await stack.enter_async_context(session.client("s3", **self._kwargs))
                self._stack = stack
            return self._client

    async def aclose(self) -> None:
        """Close the client; the next use opens a new one."""
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()


class S3ArtifactStore:
    """``s3://`` artifacts, content-addressed under ``<prefix>/<tenant>/``.

    Args:
        connection: the process's S3 client.
        bucket: an existing bucket.
        prefix: a key prefix (no leading or trailing slash), may be empty.
        multipart_threshold: bodies at least this large are uploaded in parts.
        multipart_chunk: the part size (S3's minimum is 5 MiB).
    """

    def __init__(
        self,
        connection: S3Connection,
        bucket: str,
        prefix: str = "",
        *,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        multipart_chunk: int = MULTIPART_CHUNK,
    ) -> None:
        self.connection = connection
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.multipart_threshold = multipart_threshold
        self.multipart_chunk = max(multipart_chunk, 5 * 1024 * 1024)

    @classmethod
    def from_url(cls, url: str, connection: S3Connection, **kw: Any) -> S3ArtifactStore:
        bucket, prefix = parse_s3_url(url)
        return cls(connection, bucket, prefix, **kw)

    def _join(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def key_for(self, tenant: str, sha256: str) -> str:
        return self._join(tenant_dir(tenant), sha256[:2], sha256)

    def uri_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{quote(key, safe='/')}"

    async def put(
        self, tenant: str, data: bytes, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        key = self.key_for(tenant, digest)
        s3 = await self.connection.client()
        if not await self._exists(s3, key):
            await upload(
                s3,
                self.bucket,
                key,
                data,
                content_type=media_type,
                # Object metadata is the first writer's; per-use lineage lives in the index.
                metadata={"sha256": digest, "tenant": tenant_dir(tenant)},
                multipart_threshold=self.multipart_threshold,
                part_size=self.multipart_chunk,
            )
        return ArtifactRef(
            uri=self.uri_for(key), sha256=digest, size_bytes=len(data), media_type=media_type
        )

    async def _exists(self, s3: S3Client, key: str) -> bool:
        try:
            await s3.head_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if _error_code(e) in _NOT_FOUND:
                return False
            raise
        return True

    def _resolve(self, tenant: str, ref: ArtifactRef | str) -> tuple[str, str]:
        uri = ref.uri if isinstance(ref, ArtifactRef) else ref
        if not uri.startswith("s3://"):
            raise InvalidInputError(f"not an s3:// artifact: {uri}", field="artifact")
        bucket, _, raw_key = uri[len("s3://") :].partition("/")
        key = unquote(raw_key)
        own = self._join(tenant_dir(tenant)) + "/"
        ours = f"{self.prefix}/" if self.prefix else ""
        if bucket != self.bucket or not key.startswith(ours):
            # a store this process does not have: not a question of tenancy
            raise NotFoundError(
                f"artifact {uri} is not in this process's artifact store "
                f"(s3://{self.bucket}/{ours}, from AIWORKER_ARTIFACT_STORE)",
                uri=uri,
            )
        if not key.startswith(own) or "/../" in f"/{key}/":
            raise AccessDeniedError(
                f"artifact {uri} does not belong to tenant {tenant!r}", uri=uri, tenant=tenant
            )
        rest = key[len(own) :].split("/")
        if len(rest) != 2 or not _SHA256.match(rest[1]) or rest[0] != rest[1][:2]:
            raise InvalidInputError(f"not an artifact address: {uri}", field="artifact")
        return key, rest[1]

    async def get(self, tenant: str, ref: ArtifactRef | str) -> bytes:
        key, digest = self._resolve(tenant, ref)
        s3 = await self.connection.client()
        try:
            resp = await s3.get_object(Bucket=self.bucket, Key=key)
            async with resp["Body"] as body:
                data: bytes = await body.read()
        except ClientError as e:
            if _error_code(e) in _NOT_FOUND:
                raise NotFoundError(f"artifact {digest} not found", sha256=digest) from None
            raise
        if hashlib.sha256(data).hexdigest() != digest:
            raise InvalidInputError(f"artifact {digest} is corrupt", field="artifact")
        return data

    async def aclose(self) -> None:
        await self.connection.aclose()


class S3LineageIndex:
    """Lineage records at ``<prefix>/_lineage/<workflow-id>/<record>.json``.

    Args:
        connection: the process's S3 client.
        bucket: the artifact bucket.
        prefix: the artifact prefix.
    """

    def __init__(self, connection: S3Connection, bucket: str, prefix: str = "") -> None:
        self.connection = connection
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def _dir(self, workflow_id: str, children: bool = False) -> str:
        base = f"{self.prefix}/_lineage" if self.prefix else "_lineage"
        if children:  # every <workflow_id>/... workflow's folder
            return f"{base}/{workflow_segment(workflow_id + '/')}"
        return f"{base}/{workflow_segment(workflow_id)}/"

    async def record(self, rec: ArtifactRecord) -> None:
        s3 = await self.connection.client()
        await s3.put_object(
            Bucket=self.bucket,
            Key=self._dir(rec.workflow_id) + rec.record_name(),
            Body=rec.model_dump_json().encode(),
            ContentType="application/json",
        )

    async def records(self, workflow_id: str, children: bool = False) -> list[ArtifactRecord]:
        s3 = await self.connection.client()
        keys: list[str] = []
        prefixes = [self._dir(workflow_id)] + ([self._dir(workflow_id, True)] if children else [])
        for prefix in prefixes:
            token: str | None = None
            for _ in range(MAX_RECORDS // 1000 + 1):
                kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
                if token:
                    kw["ContinuationToken"] = token
                page = await s3.list_objects_v2(**kw)
                keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(".json")]
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token or len(keys) >= MAX_RECORDS:
                    break
        out = []
        for key in keys[:MAX_RECORDS]:
            resp = await s3.get_object(Bucket=self.bucket, Key=key)
            async with resp["Body"] as body:
                out.append(ArtifactRecord.model_validate_json(await body.read()))
        return sort_records(out)


__all__ = ["S3ArtifactStore", "S3Connection", "S3LineageIndex", "parse_s3_url", "upload"]
