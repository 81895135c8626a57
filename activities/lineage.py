"""Artifact lineage: who made each artifact, for which workflow step and attempt.

The runtime binds a :class:`CallLineage` for the duration of each worker call
(a context variable, so concurrent activities in one process never mix them
up). :class:`RecordingArtifactStore` wraps any :class:`ArtifactStore` and, on
every ``put`` made inside a call, writes one :class:`ArtifactRecord` to a
:class:`LineageIndex` keyed by workflow id. Records are small JSON documents,
one per (artifact, step, attempt), named by a hash of that identity, so a
retried write is idempotent and two processes never append to the same file.
``aiworker artifacts <workflow-id>`` lists them.

Content-addressed storage dedupes the bytes; lineage is per use, so the same
page fetched by two workflows has one object and two records.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

from aiworker.activities.artifacts import ArtifactStore, atomic_write
from aiworker.schemas.protocol import ArtifactRef

# One listing never reads more records than this (a bounded loop, and a hint
# that a workflow writing more artifacts wants its own index).
MAX_RECORDS = 10_000


@dataclass(frozen=True)
class CallLineage:
    """The worker call on whose behalf artifacts are written."""

    tenant: str
    worker_id: str
    workflow_id: str | None
    step_id: str | None
    attempt: int
    trace_id: str | None
    idempotency_key: str
    activity_id: str | None = None


_current: contextvars.ContextVar[CallLineage | None] = contextvars.ContextVar(
    "aiworker_call_lineage", default=None
)


def current() -> CallLineage | None:
    """The lineage of the worker call running in this task, if any."""
    return _current.get()


@contextlib.contextmanager
def bound(lineage: CallLineage) -> Iterator[CallLineage]:
    """Make ``lineage`` current for the enclosed worker call."""
    token = _current.set(lineage)
    try:
        yield lineage
    finally:
        _current.reset(token)


def step_of(idempotency_key: str, workflow_id: str | None) -> str | None:
    """The step id inside ``{workflow_id}/{step_id}[/{item}]``, else the key itself."""
    if workflow_id and idempotency_key.startswith(workflow_id + "/"):
        return idempotency_key[len(workflow_id) + 1 :] or None
    return idempotency_key or None


class ArtifactRecord(BaseModel):
    """One use of an artifact by one attempt of one step."""

    model_config = ConfigDict(frozen=True)

    uri: str
    sha256: str
    size_bytes: int
    media_type: str
    tenant: str
    worker_id: str
    workflow_id: str
    step_id: str | None = None
    attempt: int = 1
    trace_id: str | None = None
    idempotency_key: str | None = None
    activity_id: str | None = None
    created_at: str

    @classmethod
    def of(cls, ref: ArtifactRef, tenant: str, lineage: CallLineage) -> ArtifactRecord:
        data = asdict(lineage)
        data.update(tenant=tenant)
        return cls(
            uri=ref.uri,
            sha256=ref.sha256,
            size_bytes=ref.size_bytes,
            media_type=ref.media_type,
            created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
            **data,
        )

    def step_label(self, workflow_id: str) -> str:
        """The step, with the item index for a for_each item listed under the
        pipeline ``workflow_id`` (``pages[2]``: it ran in a chunk workflow)."""
        step = self.step_id or "-"
        item = (self.idempotency_key or "").rsplit("/", 1)[-1]
        if self.workflow_id != workflow_id and item.isdigit():
            return f"{step}[{item}]"
        return step

    def record_name(self) -> str:
        """A stable name for this use: a retry of the same write lands on the same name."""
        ident = json.dumps(
            [self.sha256, self.tenant, self.worker_id, self.step_id, self.attempt],
            separators=(",", ":"),
        )
        return hashlib.sha256(ident.encode()).hexdigest()[:32] + ".json"


def workflow_segment(workflow_id: str) -> str:
    """A path segment for a workflow id that cannot escape its parent."""
    seg = quote(workflow_id, safe="")
    return "%2E" * len(seg) if seg in (".", "..") else seg


class LineageIndex(Protocol):
    """Where lineage records are kept, listed by workflow id.

    ``records(id, children=True)`` adds the records of the workflows whose id
    starts with ``<id>/``: a pipeline's for_each chunks
    (``<id>/<step>/<chunk>``), where its items' calls ran.
    """

    async def record(self, rec: ArtifactRecord) -> None: ...

    async def records(self, workflow_id: str, children: bool = False) -> list[ArtifactRecord]: ...


def sort_records(records: list[ArtifactRecord]) -> list[ArtifactRecord]:
    return sorted(records, key=lambda r: (r.created_at, r.step_id or "", r.attempt, r.sha256))


class FileLineageIndex:
    """Lineage records under ``<data_dir>/lineage/<workflow-id>/<record>.json``.

    Args:
        root: the data directory (``settings.data_dir``).
    """

    def __init__(self, root: Path) -> None:
        self.base = (Path(root) / "lineage").resolve()

    def _dir(self, workflow_id: str) -> Path:
        return self.base / workflow_segment(workflow_id)

    async def record(self, rec: ArtifactRecord) -> None:
        path = self._dir(rec.workflow_id) / rec.record_name()
        self._write(path, rec.model_dump_json().encode())

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        atomic_write(path, data)

    async def records(self, workflow_id: str, children: bool = False) -> list[ArtifactRecord]:
        return await asyncio.to_thread(self._records, workflow_id, children)

    def _records(self, workflow_id: str, children: bool) -> list[ArtifactRecord]:
        dirs = [self._dir(workflow_id)]
        if children and self.base.is_dir():
            # segments are percent-quoted: no glob magic is left in them
            dirs += sorted(self.base.glob(workflow_segment(workflow_id + "/") + "*"))
        paths = [p for d in dirs if d.is_dir() for p in sorted(d.glob("*.json"))]
        return sort_records(
            [ArtifactRecord.model_validate_json(p.read_bytes()) for p in paths[:MAX_RECORDS]]
        )


class RecordingArtifactStore:
    """An :class:`ArtifactStore` that records lineage for puts made inside a worker call.

    Args:
        store: the backend that holds the bytes.
        index: where lineage records go.
    """

    def __init__(self, store: ArtifactStore, index: LineageIndex) -> None:
        self.store = store
        self.index = index

    async def put(
        self, tenant: str, data: bytes, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        ref = await self.store.put(tenant, data, media_type)
        lineage = current()
        if lineage is not None and lineage.workflow_id:
            await self.index.record(ArtifactRecord.of(ref, tenant, lineage))
        return ref

    async def get(self, tenant: str, ref: ArtifactRef | str) -> bytes:
        return await self.store.get(tenant, ref)

    async def aclose(self) -> None:
        close = getattr(self.store, "aclose", None)
        if close is not None:
            await close()


__all__ = [
    "ArtifactRecord",
    "CallLineage",
    "FileLineageIndex",
    "LineageIndex",
    "RecordingArtifactStore",
    "bound",
    "current",
    "step_of",
]
