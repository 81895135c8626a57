"""Conditional requests for the web-scrape worker: an unchanged page costs one cheap request.

After a ``succeeded`` scrape whose response carried an ``ETag`` or a
``Last-Modified``, :meth:`Revalidation.remember` keeps an entry: those
validators, the URL that issued them (the final URL, after redirects), the
raw page's :class:`~aiworker.schemas.protocol.ArtifactRef` and the
extraction's outputs (``data``, ``warnings`` and the ``source`` block). The
next scrape of the same page (:meth:`Revalidation.fetch`) sends
``If-None-Match`` / ``If-Modified-Since`` on the hop to that URL; a ``304``
there returns the remembered outputs, with ``source.not_modified: true``,
``source.status_code: 304`` and this request's timing, and the remembered
page artifact, so steps downstream read ``data`` exactly as after a full
scrape. A ``200`` is extracted as usual and its validators replace the
entry's. Weak ETags (``W/"..."``) are sent back as given; what a validator
means is the server's business.

**Key.** sha256 of the canonical JSON of the tenant, the canonical URL
(scheme and host lower-cased, default port and fragment dropped), the
worker's spec version and the sha256 of the rest of the input (extraction
spec, user agent, render options: everything but ``url`` and ``cache``). A
different extraction spec is a different entry, so a ``304`` never answers
with data extracted for another spec; the price is one full fetch per spec
before its first ``304``.

**Where.** Beside the artifacts, as the step cache keeps its entries
(:func:`~aiworker.activities.step_cache.backend_beside`):
``<data_dir>/revalidate/<tenant>/<key[:2]>/<key>.json``, or
``<prefix>/_revalidate/<tenant>/...`` in the S3 bucket of
``AIWORKER_ARTIFACT_STORE``. Never in workflow history.

**Bounds.** A validator over 1024 characters, or one that is no clean header
value, or a ``Last-Modified`` that is no HTTP date, is not kept (a page
without a usable one is not remembered at all). Outputs over 256 KiB of JSON
go to the artifact store (``application/json``) and the entry keeps their
reference. A shard keeps at most 64 entries (256 shards: 16,384 per tenant),
dropping the oldest, and entries not rewritten for 30 days are pruned.

**A 304 without an entry.** A server that answers ``304`` to a request that
asked no condition, or an entry whose stored outputs are gone or damaged, is
answered by one unconditional re-fetch (never a loop); a ``304`` to that is
``fetch_failed`` (reason ``unexpected_not_modified``). Either way the call
counts one external call, like a ``304``: the ``fetch_url`` tool is used once.

**Off.** ``cache: "off"`` in the web-scrape input reads and writes no entry
and sends no condition. It is not the step-level ``cache: {"ttl_seconds": N}``
of :mod:`~aiworker.activities.step_cache`, which skips the call altogether.
A read or a write that fails is logged and the scrape goes on unconditionally:
this is an optimisation, never a new way to fail.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aiworker.activities.artifacts import ArtifactStore
from aiworker.activities.errors import FetchFailedError, InvalidInputError
from aiworker.activities.step_cache import CacheBackend, backend_beside, canonical_json
from aiworker.activities.tools.fetch import FetchResult, check_header_value
from aiworker.schemas.protocol import MAX_CACHE_TTL_SECONDS, ArtifactRef

log = logging.getLogger("aiworker.revalidate")

AREA = "revalidate"
MAX_PER_SHARD = 64
MAX_INLINE_OUTPUTS = 256 * 1024
KEEP_SECONDS = MAX_CACHE_TTL_SECONDS
_FORMAT = 1
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Input keys that do not change what a fetch extracts.
_NOT_IN_KEY = frozenset({"url", "cache"})

Fetch = Callable[[tuple[str, Mapping[str, str]] | None], Awaitable[FetchResult]]


def canonical_url(url: str) -> str:
    """``url`` with scheme and host lower-cased, default port and fragment dropped."""
    p = urlsplit(url.strip())
    scheme = p.scheme.lower()
    host = (p.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = p.port
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, p.path or "/", p.query, ""))


def entry_key(tenant: str, url: str, worker_input: Mapping[str, Any], version: str) -> str:
    """The entry key of a scrape: tenant, canonical URL, spec version, the rest of the input."""
    rest = {k: v for k, v in worker_input.items() if k not in _NOT_IN_KEY}
    doc = {
        "format": _FORMAT,
        "tenant": tenant,
        "url": canonical_url(url),
        "version": version,
        "request": hashlib.sha256(canonical_json(rest)).hexdigest(),
    }
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def usable_validators(page: FetchResult) -> dict[str, str]:
    """The page's ``etag`` and ``last_modified`` that may be sent back, bounded."""
    out: dict[str, str] = {}
    for name, value in (("etag", page.etag), ("last_modified", page.last_modified)):
        if not value:
            continue
        try:
            check_header_value(value, name)
            if name == "last_modified":
                parsedate_to_datetime(value)
        except (InvalidInputError, TypeError, ValueError):
            continue  # too long, not a header value, not a date: not sent back
        out[name] = value
    return out


def _dump(value: Any) -> bytes:
    # Not canonical_json: the outputs keep their key order, as a fresh scrape's.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


@dataclass
class NotModified:
    """A ``304``: the remembered outputs with this request's ``source``."""

    outputs: dict[str, Any]
    artifacts: list[ArtifactRef]


@dataclass
class _Entry:
    final_url: str
    validators: dict[str, str]
    page: ArtifactRef
    source: dict[str, Any]
    outputs: dict[str, Any] | None
    outputs_ref: ArtifactRef | None

    def conditional(self, url: str) -> tuple[str, dict[str, str]]:
        """Headers for the hop to the URL that issued the validators: ``url`` itself
        when it names the same page (another spelling of it, say), else the stored
        final URL (a redirect's target, spelled as the redirect spells it)."""
        hop = url if canonical_url(url) == canonical_url(self.final_url) else self.final_url
        headers = {}
        if "etag" in self.validators:
            headers["If-None-Match"] = self.validators["etag"]
        if "last_modified" in self.validators:
            headers["If-Modified-Since"] = self.validators["last_modified"]
        return hop, headers


class PageValidators:
    """Where a process's entries live; :meth:`session` serves one scrape.

    Args:
        backend: the entry store (file or S3, as the step cache's).
        store: the artifact store (page and large outputs).
        clock: POSIX seconds now (tests may pass their own).
    """

    def __init__(
        self, backend: CacheBackend, store: ArtifactStore, clock: Callable[[], float] = time.time
    ) -> None:
        self.backend = backend
        self.store = store
        self.clock = clock

    @classmethod
    def beside(cls, artifact_store: ArtifactStore, data_dir: Path) -> PageValidators:
        """Entries in the same place as ``artifact_store`` (its bucket, or ``data_dir``)."""
        backend = backend_beside(artifact_store, data_dir, area=AREA, max_per_shard=MAX_PER_SHARD)
        return cls(backend, artifact_store)

    def session(
        self, tenant: str, worker_input: Mapping[str, Any], version: str, *, enabled: bool = True
    ) -> Revalidation:
        """One scrape of ``input["url"]`` for ``tenant``; ``enabled=False`` is ``cache: "off"``
        (no entry is read or written, so no key is made: two hashes of the input a page)."""
        key = entry_key(tenant, worker_input["url"], worker_input, version) if enabled else ""
        return Revalidation(self, tenant, worker_input["url"], key, enabled)


class Revalidation:
    """The conditional fetch of one scrape (see the module docstring)."""

    def __init__(
        self, owner: PageValidators, tenant: str, url: str, key: str, enabled: bool
    ) -> None:
        self._owner = owner
        self.tenant = tenant
        self.url = url
        self.key = key
        self.enabled = enabled

    async def fetch(self, fetch: Fetch) -> FetchResult | NotModified:
        """The page (a ``200``) or the remembered outputs (a ``304``).

        ``fetch(conditional)`` fetches the page, sending ``conditional``'s
        headers on its hop (``FetchTool.fetch``'s argument).
        """
        entry = await self._recall() if self.enabled else None
        try:
            page = await fetch(entry.conditional(self.url) if entry else None)
        except FetchFailedError as e:
            if e.context.get("reason") != "unexpected_not_modified":
                raise
            log.warning("a 304 to an unconditional request; fetching once more: %s", e.message)
            return await fetch(None)
        if page.status_code != 304:
            return page
        outputs = await self._outputs(entry) if entry else None
        if entry is None or outputs is None:
            log.warning("a 304 without a usable entry; fetching unconditionally: %s", page.url)
            return await fetch(None)
        source = {
            **entry.source,
            "url": page.url,
            "final_url": page.final_url,
            "status_code": page.status_code,
            "fetched_at": page.fetched_at,
            "elapsed_ms": page.elapsed_ms,
            "redirects": page.redirects,
            "not_modified": True,
            "previous_fetched_at": entry.source.get("fetched_at"),
        }
        return NotModified({**outputs, "source": source}, [entry.page])

    async def remember(
        self, page: FetchResult, page_ref: ArtifactRef, outputs: Mapping[str, Any]
    ) -> None:
        """Keep ``outputs`` of a ``succeeded`` extraction of ``page`` with its validators."""
        validators = usable_validators(page)
        if not self.enabled or not validators:
            return
        kept = {"data": outputs["data"], "warnings": outputs.get("warnings", [])}
        source = {k: v for k, v in outputs["source"].items() if k != "not_modified"}
        entry: dict[str, Any] = {
            "format": _FORMAT,
            "key": self.key,
            "final_url": page.final_url,
            "validators": validators,
            "page": page_ref.model_dump(mode="json"),
            "source": source,
        }
        try:
            body = _dump(kept)
            if len(body) > MAX_INLINE_OUTPUTS:
                ref = await self._owner.store.put(self.tenant, body, "application/json")
                entry["outputs_ref"] = ref.model_dump(mode="json")
            else:
                entry["outputs"] = kept
            now = self._owner.clock()
            entry["stored_at"] = now
            await self._owner.backend.write(
                self.tenant, self.key, _dump(entry), now=now, ttl=KEEP_SECONDS
            )
        except Exception as e:  # the result stands; only the next request's condition is lost
            log.warning(
                "conditional request entry not stored: %s", e, extra={"cache_key": self.key}
            )

    async def _recall(self) -> _Entry | None:
        try:
            raw = await self._owner.backend.read(self.tenant, self.key)
            doc = json.loads(raw) if raw is not None else None
            if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
                return None
            if doc.get("key") != self.key or not isinstance(doc.get("validators"), dict):
                return None
            outputs = doc.get("outputs")
            ref = doc.get("outputs_ref")
            return _Entry(
                final_url=str(doc["final_url"]),
                validators={str(k): str(v) for k, v in doc["validators"].items()},
                page=ArtifactRef.model_validate(doc["page"]),
                source=dict(doc["source"]),
                outputs=outputs if isinstance(outputs, dict) else None,
                outputs_ref=ArtifactRef.model_validate(ref) if ref is not None else None,
            )
        except Exception as e:  # an unreadable entry is no entry
            log.warning(
                "conditional request entry unreadable: %s", e, extra={"cache_key": self.key}
            )
            return None

    async def _outputs(self, entry: _Entry) -> dict[str, Any] | None:
        if entry.outputs is not None:
            return entry.outputs
        if entry.outputs_ref is None:
            return None
        try:
            doc = json.loads(await self._owner.store.get(self.tenant, entry.outputs_ref))
        except Exception as e:  # pruned or damaged: the caller fetches unconditionally
            log.warning("stored outputs unavailable: %s", e, extra={"cache_key": self.key})
            return None
        return doc if isinstance(doc, dict) and "data" in doc else None


__all__ = [
    "NotModified",
    "PageValidators",
    "Revalidation",
    "canonical_url",
    "entry_key",
    "usable_validators",
]
