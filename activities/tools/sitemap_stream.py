"""Sitemap files read as a stream: lxml's pull parser over a bounded body.

Each finished entry (``<url>`` of a ``<urlset>``, ``<sitemap>`` of a
``<sitemapindex>``) is handed out while the body arrives, then removed from
the tree with everything else that has ended, so memory holds one entry at
most whatever the file holds. A gzip file (``.xml.gz``, served as
``application/gzip``) is recognized by its magic bytes and gunzipped with the
same bounded decoder as an HTTP ``Content-Encoding``
(:mod:`~aiworker.activities.bodies`), its output capped at
:data:`SITEMAP_MAX_BYTES`, the protocol's own limit: a gzip bomb stops there.
Entities are never resolved, no DTD is loaded, nothing comes from the network.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from lxml import etree  # type: ignore[import-untyped]

from aiworker.activities import bodies
from aiworker.activities.errors import FetchFailedError, PayloadTooLargeError

# sitemaps.org: a sitemap file holds at most 50 MB uncompressed.
SITEMAP_MAX_BYTES = 50 * 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"


def local_name(tag: Any) -> str:
    """An element's tag without its namespace (comments and the like: empty)."""
    return etree.QName(tag).localname if isinstance(tag, str) else ""


@dataclass
class BodyRead:
    """What was read of a sitemap's body (decoded from its Content-Encoding).

    Attributes:
        size: bytes read.
        sha256: their running hash.
    """

    size: int = 0
    sha256: Any = field(default_factory=hashlib.sha256)


async def entries(
    pieces: AsyncGenerator[bytes, None], url: str, body: BodyRead
) -> AsyncGenerator[Any, None]:
    """Each finished ``<url>`` / ``<sitemap>`` element of a sitemap body, parsed as it
    arrives (gunzipped when the body is a gzip file), cleared once the caller is done.

    Args:
        pieces: the body as :meth:`FetchTool.iter_body` yields it.
        url: the sitemap's URL, for messages.
        body: counts and hashes what was read.

    Raises:
        PayloadTooLargeError: the gunzipped file passed :data:`SITEMAP_MAX_BYTES`.
        FetchFailedError: a corrupt gzip file.
        lxml.etree.XMLSyntaxError: not XML, or cut short.
    """
    parser = etree.XMLPullParser(
        events=("end",),
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        remove_comments=True,
        remove_pis=True,
        huge_tree=False,
    )
    gunzip: Any = None
    produced = 0
    async with contextlib.aclosing(pieces):
        async for piece in pieces:
            if body.size == 0 and piece.startswith(_GZIP_MAGIC):
                # A .gz file (served as application/gzip or x-gzip): the same bounded
                # decoder as for Content-Encoding, with the same cap on its output.
                gunzip = bodies.decoder_for(["gzip"])
            body.size += len(piece)
            body.sha256.update(piece)
            try:
                for data in gunzip.feed(piece) if gunzip is not None else (piece,):
                    produced += len(data)
                    if produced > SITEMAP_MAX_BYTES:
                        raise PayloadTooLargeError(
                            f"{url} decompresses past the {SITEMAP_MAX_BYTES}-byte sitemap limit",
                            url=url,
                            limit_bytes=SITEMAP_MAX_BYTES,
                        )
                    parser.feed(data)
                    for _, el in parser.read_events():
                        parent = el.getparent()
                        if parent is None:
                            continue  # the root's own end
                        tag = local_name(el.tag)
                        if parent.getparent() is None and tag in ("url", "sitemap"):
                            yield el
                        elif tag == "loc" and parent.find("{*}loc") is el:
                            continue  # its entry needs it, until the entry ends
                        # Every other element goes as soon as it ends (an entry once read),
                        # so the tree holds one entry at most, whatever the file holds.
                        el.clear()
                        parent.remove(el)
            except bodies.CorruptBodyError as e:
                raise FetchFailedError(f"cannot gunzip {url}: {e}", url=url) from None
        if gunzip is not None:
            try:
                gunzip.finish()
            except bodies.CorruptBodyError as e:
                raise FetchFailedError(f"cannot gunzip {url}: {e}", url=url) from None
    parser.close()
