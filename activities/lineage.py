"""Artifact lineage: who made each artifact, for which workflow step and attempt.

The runtime binds a :class:`CallLineage` for the duration of each worker call
(a context variable, so concurrent activities in one process never mix them
up). :class:`RecordingArtifactStore` wraps any :class:`ArtifactStore` and, on
every ``put`` made inside a call, writes one :class:`ArtifactRecord` to a
:class:`LineageIndex` keyed by workflow id. A record is a small JSON document,
one per (artifact, step, attempt), whose identity is a hash of that
(:meth:`ArtifactRecord.record_name`): a retried write is the same record, and a
listing keeps one of each. ``aiworker artifacts <workflow-id>`` lists them.

Content-addressed storage dedupes the bytes; lineage is per use, so the same
page fetched by two workflows has one object and two records.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, ValidationError

from aiworker.activities.artifacts import ArtifactStore, open_file
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
    """Lineage records under ``<data_dir>/lineage/<workflow-id>/``, appended as JSON
    lines to one file per workflow and writer (``<writer>.jsonl``; each index
    object is a writer with its own random name, so two processes never append
    to the same file). Records of earlier versions, one file each
    (``<record>.json``), are read alongside.

    Why lines and not a file per record: a crawl writes a record for every page,
    and a new file written safely (a temporary file, then a rename) cost 0.1 to 1
    ms of kernel time on the disk the figures were taken on, where an append to an
    existing file costs a few microseconds. Each record goes in one ``write`` on
    an ``O_APPEND`` descriptor, behind a newline: a writer that died in mid-line
    leaves one line that does not parse, which a listing skips, and never joins it
    to the next record.

    Args:
        root: the data directory (``settings.data_dir``).
    """

    def __init__(self, root: Path) -> None:
        self.base = (Path(root) / "lineage").resolve()
        self.writer = f"{uuid.uuid4().hex[:16]}.jsonl"

    def _dir(self, workflow_id: str) -> Path:
        return self.base / workflow_segment(workflow_id)

    async def record(self, rec: ArtifactRecord) -> None:
        path = self._dir(rec.workflow_id) / self.writer
        _append(path, b"\n" + rec.model_dump_json().encode())  # an append: cheap inline

    async def records(self, workflow_id: str, children: bool = False) -> list[ArtifactRecord]:
        return await asyncio.to_thread(self._records, workflow_id, children)

    def _records(self, workflow_id: str, children: bool) -> list[ArtifactRecord]:
        dirs = [self._dir(workflow_id)]
        if children and self.base.is_dir():
            # segments are percent-quoted: no glob magic is left in them
            dirs += sorted(self.base.glob(workflow_segment(workflow_id + "/") + "*"))
        found: dict[str, ArtifactRecord] = {}
        read = 0
        for path in (p for d in dirs if d.is_dir() for p in sorted(d.iterdir())):
            if read >= MAX_RECORDS:
                break  # no file more is read
            if path.suffix == ".json":
                docs = [path.read_bytes()]
            elif path.suffix == ".jsonl":
                docs = [line for line in path.read_bytes().split(b"\n") if line.strip()]
            else:
                continue  # a temporary file of an earlier version's write
            for doc in docs:
                if read >= MAX_RECORDS:
                    break
                read += 1
                try:
                    rec = ArtifactRecord.model_validate_json(doc)
                except ValidationError:
                    continue  # a line its writer did not finish
                seen = found.get(rec.record_name())
                if seen is None or rec.created_at >= seen.created_at:
                    found[rec.record_name()] = rec  # a retried write: the latest
        return sort_records(list(found.values()))


def _append(path: Path, data: bytes) -> None:
    """``data`` at the end of ``path`` in one ``write`` (the directory made if missing)."""
    fd = open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it whole; a short write goes on after itself
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


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
