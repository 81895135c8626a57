"""Large payloads out of the workflow history, through the SDK's external storage.

Every client and worker gets a data converter whose
:class:`temporalio.converter.ExternalStorage` moves any payload of at least
``AIWORKER_PAYLOAD_THRESHOLD_BYTES`` (256 KiB) to the artifact store and puts
only a small reference in the history, so a 5 MB step result never meets
Temporal's payload limits. It runs in the SDK's payload conversion, outside
the workflow sandbox, so workflow code stays free of I/O.

Drivers: with ``s3://`` the SDK's own
:class:`~temporalio.contrib.aws.s3driver.S3StorageDriver` (the SDK's
keys ``v0/ns/<namespace>/...`` under ``<prefix>/_payloads/`` in the artifact
bucket; each reference names its whole key, see :class:`PrefixedS3StorageDriver`);
with ``file`` :class:`ArtifactStoreDriver` over a file store under
``<data_dir>/payloads/<namespace>/`` (one host or a shared volume). The file
driver is registered in both cases so that payloads written before a switch
to S3 stay readable.

A for_each chunk's input and result (payloads the converter marks with
``SPILL_METADATA``) leave the history from :data:`SPILL_THRESHOLD_BYTES` on,
whatever the threshold: they carry every item's input or outputs, so inline
they would grow the parent's history with the item count. What is stored is
keyed by its hash, so a workflow task that runs again stores nothing new.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from temporalio.api.common.v1 import Payload
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverSelectContext,
    StorageDriverStoreContext,
)

from aiworker.activities.artifacts import ArtifactStore, FileArtifactStore
from aiworker.config.extras import require
from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import SPILL_METADATA

if TYPE_CHECKING:
    # The AWS SDK loads only in processes configured for S3.
    from aiworker.activities.artifacts_s3 import S3Connection

PAYLOAD_MEDIA_TYPE = "application/x-temporal-payload"
SPILL_THRESHOLD_BYTES = 1024
"""A marked for_each chunk payload this large or larger goes to the store
(a reference is about 300 bytes: smaller ones stay inline)."""
FILE_DRIVER = "aiworker.file"


class ArtifactStoreDriver(StorageDriver):
    """Stores serialized payloads in an :class:`ArtifactStore`, scoped by namespace.

    Args:
        store: a store reserved for payloads (never a tenant-facing one, so
            no tenant can name a payload as its artifact).
        name: the driver name written into every reference.
    """

    def __init__(self, store: ArtifactStore, name: str = FILE_DRIVER) -> None:
        self._store = store
        self._name = name

    def name(self) -> str:
        return self._name

    def type(self) -> str:
        return "aiworker.artifact-store"

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        scope = (context.target.namespace if context.target else "") or "default"
        claims = []
        for p in payloads:
            ref = await self._store.put(scope, p.SerializeToString(), PAYLOAD_MEDIA_TYPE)
            claims.append(
                StorageDriverClaim({"scope": scope, "uri": ref.uri, "sha256": ref.sha256})
            )
        return claims

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        out = []
        for c in claims:
            data = await self._store.get(c.claim_data["scope"], c.claim_data["uri"])
            if hashlib.sha256(data).hexdigest() != c.claim_data.get("sha256"):
                raise ValueError(f"external payload {c.claim_data['uri']} failed its hash check")
            p = Payload()
            p.ParseFromString(data)
            out.append(p)
        return out


class _LazyAioboto3Client(S3StorageDriverClient):
    """The SDK's aioboto3 adapter over a client opened on first use.

    Uploads go through :func:`activities.artifacts_s3.upload`, which hands the
    HTTP client a stream rather than one multi-megabyte ``bytes`` body (the
    SDK adapter's path makes aiohttp warn that this can block the loop).

    Writes (``object_exists``, ``put_object``) get ``key_prefix`` in front of
    the SDK's key, so that everything aiworker writes stays under the
    configured ``s3://bucket/prefix``. Reads take the whole key as
    :class:`PrefixedS3StorageDriver` resolves it from the reference.
    """

    def __init__(self, connection: S3Connection, key_prefix: str = "") -> None:
        self._connection = connection
        self._prefix = key_prefix

    async def _inner(self) -> S3StorageDriverClient:
        from temporalio.contrib.aws.s3driver.aioboto3 import new_aioboto3_client

        return new_aioboto3_client(await self._connection.client())

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        from aiworker.activities.artifacts_s3 import upload

        s3 = await self._connection.client()
        await upload(s3, bucket, self._prefix + key, data, content_type=PAYLOAD_MEDIA_TYPE)

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        return await (await self._inner()).object_exists(bucket=bucket, key=self._prefix + key)

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        return await (await self._inner()).get_object(bucket=bucket, key=key)

    def describe(self) -> Mapping[str, str]:
        return {"key_prefix": self._prefix} if self._prefix else {}


class PrefixedS3StorageDriver(S3StorageDriver):
    """The SDK's S3 driver, writing under a key prefix that its references name.

    The SDK's reference holds the bucket and the key it built; this driver
    adds the prefix it wrote under (``key_prefix``) and makes ``key`` the
    object's whole key, so any reader finds the object whatever prefix it is
    configured with itself: a moved store or a rolling deploy that changes
    ``AIWORKER_ARTIFACT_STORE`` keeps older histories readable. A reference
    without ``key_prefix`` (written before it was recorded) is read under the
    reader's own prefix, as it was then.

    Args:
        connection: the process's S3 client.
        bucket: the artifact bucket.
        key_prefix: prepended to the SDK's keys on write (ends with ``/``, or empty).
    """

    def __init__(self, connection: S3Connection, bucket: str, key_prefix: str = "") -> None:
        super().__init__(client=_LazyAioboto3Client(connection, key_prefix), bucket=bucket)
        self._key_prefix = key_prefix

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        return [
            StorageDriverClaim(
                {
                    **c.claim_data,
                    "key": self._key_prefix + c.claim_data["key"],
                    "key_prefix": self._key_prefix,
                }
            )
            for c in await super().store(context, payloads)
        ]

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        whole = [
            c
            if "key_prefix" in c.claim_data
            else StorageDriverClaim({**c.claim_data, "key": self._key_prefix + c.claim_data["key"]})
            for c in claims
        ]
        return await super().retrieve(context, whole)


def external_storage(settings: Settings, s3: S3Connection | None = None) -> ExternalStorage:
    """External storage for ``settings``: the configured store's driver above the threshold."""
    file_driver = ArtifactStoreDriver(FileArtifactStore(settings.data_dir, area="payloads"))
    drivers: list[StorageDriver] = [file_driver]
    primary: StorageDriver = file_driver
    if settings.artifact_store.startswith("s3://"):
        from aiworker.workers.process.resources import S3_FEATURE

        require("s3", S3_FEATURE)
        from aiworker.activities.artifacts_s3 import parse_s3_url

        if s3 is None:
            from aiworker.workers.process.resources import s3_connection

            s3 = s3_connection()
        bucket, prefix = parse_s3_url(settings.artifact_store)
        key_prefix = f"{prefix}/_payloads/" if prefix else "_payloads/"
        primary = PrefixedS3StorageDriver(s3, bucket, key_prefix)
        drivers.insert(0, primary)

    threshold = settings.payload_threshold_bytes

    def select(_: StorageDriverSelectContext, payload: Payload) -> StorageDriver | None:
        if SPILL_METADATA in payload.metadata or payload.ByteSize() >= threshold:
            return primary
        return None

    return ExternalStorage(
        drivers=drivers,
        driver_selector=select,
        payload_size_threshold=min(threshold, SPILL_THRESHOLD_BYTES),
    )


__all__ = [
    "SPILL_THRESHOLD_BYTES",
    "ArtifactStoreDriver",
    "PrefixedS3StorageDriver",
    "external_storage",
]
