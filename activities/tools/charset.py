"""The text of a fetched body: its encoding found as browsers find it.

In order: a byte-order mark, the HTTP ``charset``, a ``<meta charset>`` in the
first 4 KiB, strict UTF-8, then detection (charset-normalizer). Labels map to
their WHATWG supersets (``latin-1`` is decoded as ``windows-1252``), so a page
decodes as a browser shows it.
"""

from __future__ import annotations

import codecs
import re

_META_CHARSET = re.compile(rb"""<meta[^>]+?charset\s*=\s*["']?\s*([A-Za-z0-9_.:\-]+)""", re.I)
# WHATWG: these labels mean their Windows supersets in every browser.
_SUPERSETS = {
    "ascii": "cp1252",
    "latin_1": "cp1252",
    "iso8859_1": "cp1252",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "gb2312": "gb18030",
    "gbk": "gb18030",
}
_LABELS = {
    "cp1252": "windows-1252",
    "cp932": "shift_jis",
    "cp949": "euc-kr",
    "utf-8": "utf-8",
    "utf-8-sig": "utf-8",
}


def _codec(label: str | bytes | None) -> str | None:
    if not label:
        return None
    if isinstance(label, bytes):
        label = label.decode("ascii", "ignore")
    try:
        name = codecs.lookup(label.strip().strip("\"'")).name
    except LookupError:
        return None
    return _SUPERSETS.get(name.replace("-", "_"), name)


def decode_body(body: bytes, header_charset: str | None) -> tuple[str, str]:
    """Text and encoding label: BOM, HTTP header, ``<meta charset>``, UTF-8, detection."""
    for bom, bom_enc in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                         (codecs.BOM_UTF16_BE, "utf-16")):  # fmt: skip
        if body.startswith(bom):
            return body.decode(bom_enc, errors="replace"), _LABELS.get(bom_enc, bom_enc)
    enc = _codec(header_charset)
    if enc is None:
        m = _META_CHARSET.search(body[:4096])
        enc = _codec(m.group(1)) if m else None
    if enc is None:
        try:
            return body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            from charset_normalizer import from_bytes

            best = from_bytes(body[:65536]).best()
            enc = _codec(best.encoding) if best is not None else None
            enc = enc or "cp1252"
    return body.decode(enc, errors="replace"), _LABELS.get(enc, enc)
