"""Eval datasets: JSON Lines files of recorded calls (``aiworker eval dataset``).

The format (docs/evals.md)::

    {"aiworker_dataset": 1, "sha256": "<hex>", "items": N, "query": {...}}   header
    {"id": "...", "worker": "...", "input": {...}, "output": {...}, ...}       one line per item

The header is the first line; ``sha256`` is the SHA-256 of every byte after the
header line (the item lines, each ending in ``\\n``), so a changed, added or
dropped item changes it. Item lines are canonical JSON (keys sorted, no spaces,
UTF-8) and sorted by (``started_at``, ``workflow_id``, ``run_id``,
``scheduled_event_id``): the same query on the same history writes the same
bytes. A hand-written dataset may leave the header out (its hash is computed
when it is read) and most fields out (an item needs ``id`` and ``input``; the
gold output is ``review.outputs`` when a review approved, else ``output``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from aiworker.schemas.base import Model
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.evals import MAX_EVAL_ITEMS
from aiworker.schemas.names import TENANT_PATTERN
from aiworker.schemas.spec import describe_validation
from aiworker.workers.evals.recorded import RecordedCall

FORMAT_VERSION = 1
MAX_LINE_BYTES = 1_000_000
"""The longest item line read (an item's input and output together)."""
MAX_FILE_BYTES = 64_000_000


class DatasetError(Exception):
    """A dataset that cannot be written or read; ``code`` is a stable error code,
    ``line`` the 1-based line it is about (None: the whole file)."""

    def __init__(self, message: str, code: ErrorCode, *, line: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.line = line


class ItemReview(Model):
    """A human review of the step the call came from."""

    decision: Literal["approve", "reject", "retry"]
    reviewer: str | None = None
    note: str | None = None
    outputs: dict[str, Any] | None = None


class DatasetItem(Model):
    """One line of a dataset: a recorded call (or a hand-written case)."""

    id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/-]+$")
    input: dict[str, Any]
    output: dict[str, Any] | None = None
    review: ItemReview | None = None
    worker: str | None = None
    version: str | None = None
    model: str | None = None
    tenant: str = Field(default="default", pattern=TENANT_PATTERN)
    pipeline: str | None = None
    workflow_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    status: str = "succeeded"
    error_code: str | None = None
    usage: dict[str, Any] = Field(default_factory=dict)
    cost_usd: float = Field(default=0.0, ge=0)
    external_calls: int = Field(default=0, ge=0)
    duration_ms: float = Field(default=0.0, ge=0)
    started_at: str | None = None
    scheduled_event_id: int = Field(default=0, ge=0)

    @property
    def gold(self) -> dict[str, Any] | None:
        """The output to agree with: an approved review's outputs, else the recorded output."""
        if self.review is not None and self.review.decision == "approve" and self.review.outputs:
            return self.review.outputs
        return self.output

    @property
    def gold_source(self) -> str:
        """``review`` or ``recorded`` (or ``none``)."""
        if self.review is not None and self.review.decision == "approve" and self.review.outputs:
            return "review"
        return "recorded" if self.output is not None else "none"


class DatasetHeader(Model):
    """The first line of a written dataset."""

    aiworker_dataset: Literal[1]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    items: int = Field(ge=0)
    query: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class Dataset:
    """A dataset read from a file: its items, their content hash, the query it came from."""

    items: list[DatasetItem]
    sha256: str
    query: dict[str, Any]
    path: str


def item_id(call: RecordedCall) -> str:
    """A call's stable id: 16 hex digits of the hash of its run and scheduled event."""
    key = f"{call.workflow_id}/{call.run_id}/{call.scheduled_event_id}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def canonical(value: Any) -> str:
    """``value`` as canonical JSON: keys sorted, no spaces, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _sort_key(call: RecordedCall) -> tuple[str, str, str, int]:
    return (call.started_at, call.workflow_id, call.run_id, call.scheduled_event_id)


def render(calls: Iterable[RecordedCall], query: dict[str, Any]) -> bytes:
    """The dataset file of ``calls``: header, then the sorted item lines."""
    lines = [
        canonical({"id": item_id(c), **c.to_json()}) + "\n" for c in sorted(calls, key=_sort_key)
    ]
    if len(lines) > MAX_EVAL_ITEMS:
        raise DatasetError(
            f"{len(lines)} calls match: a dataset holds at most {MAX_EVAL_ITEMS} (use --limit)",
            ErrorCode.PAYLOAD_TOO_LARGE,
        )
    body = "".join(lines).encode("utf-8")
    header = {
        "aiworker_dataset": FORMAT_VERSION,
        "sha256": hashlib.sha256(body).hexdigest(),
        "items": len(lines),
        "query": query,
    }
    return (canonical(header) + "\n").encode("utf-8") + body


def _line_error(n: int, why: str) -> DatasetError:
    return DatasetError(f"dataset line {n}: {why}", ErrorCode.INVALID_INPUT, line=n)


def parse(raw: bytes, path: str = "<dataset>") -> Dataset:
    """Read a dataset file's bytes.

    Raises:
        DatasetError: a malformed line (named by its number), a hash that does not
            match, a duplicate id, no items, or too many.
    """
    if len(raw) > MAX_FILE_BYTES:
        raise DatasetError(
            f"{path}: {len(raw)} bytes, more than {MAX_FILE_BYTES}", ErrorCode.PAYLOAD_TOO_LARGE
        )
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    header: DatasetHeader | None = None
    start = 0
    if lines and lines[0].lstrip().startswith(b'{"aiworker_dataset"'):
        try:
            header = DatasetHeader.model_validate_json(lines[0])
        except ValidationError as e:
            raise _line_error(1, f"not a dataset header: {describe_validation(e)}") from None
        start = 1
    items: list[DatasetItem] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines[start:], start=start + 1):
        if not line.strip():
            raise _line_error(n, "empty line (one JSON object per line)")
        if len(line) > MAX_LINE_BYTES:
            raise _line_error(n, f"{len(line)} bytes, more than {MAX_LINE_BYTES}")
        try:
            doc = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _line_error(n, f"not valid JSON ({e})") from None
        try:
            item = DatasetItem.model_validate(doc)
        except ValidationError as e:
            raise _line_error(n, describe_validation(e)) from None
        if item.id in seen:
            raise _line_error(n, f"id {item.id!r} is also on line {seen[item.id]}")
        seen[item.id] = n
        items.append(item)
        if len(items) > MAX_EVAL_ITEMS:
            raise DatasetError(
                f"{path}: more than {MAX_EVAL_ITEMS} items", ErrorCode.PAYLOAD_TOO_LARGE, line=n
            )
    body = b"".join(line + b"\n" for line in lines[start:])
    digest = hashlib.sha256(body).hexdigest()
    if header is not None:
        if header.sha256 != digest:
            raise DatasetError(
                f"{path}: the items do not match the header's sha256 (the file was changed "
                "after it was written; drop the header line to use it as hand-written)",
                ErrorCode.INVALID_INPUT,
                line=1,
            )
        if header.items != len(items):
            raise _line_error(1, f"the header says {header.items} items, the file has {len(items)}")
    if not items:
        raise DatasetError(f"{path}: the dataset has no items", ErrorCode.INVALID_INPUT)
    return Dataset(items, digest, header.query if header else {}, path)


def load(path: str | Path) -> Dataset:
    """Read and check the dataset file at ``path`` (see :func:`parse`)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise DatasetError(f"no dataset file {p}", ErrorCode.NOT_FOUND) from None
    except OSError as e:
        raise DatasetError(f"cannot read {p}: {e.strerror}", ErrorCode.INVALID_INPUT) from None
    return parse(raw, str(p))


__all__ = [
    "Dataset",
    "DatasetError",
    "DatasetHeader",
    "DatasetItem",
    "ItemReview",
    "canonical",
    "item_id",
    "load",
    "parse",
    "render",
]
