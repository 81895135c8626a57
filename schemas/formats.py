"""The JSON Schema format checks aiworker applies, each in linear time.

jsonschema's Draft 2020-12 format checker, with two checks replaced:

- ``regex`` compiles the string with RE2 (:mod:`.patterns`), the engine user
  patterns run on, instead of Python's ``re``;
- ``iri`` and ``iri-reference``: jsonschema checks them with
  ``rfc3987-syntax``, a general (Earley) parser that took 7 s for a
  16,000-character string, in a worker's event loop or a workflow task. Here
  an IRI is mapped to a URI as RFC 3987 section 3.1 does (its non-ASCII
  characters, which must be ``ucschar`` or ``iprivate``, percent-encoded as
  UTF-8) and the URI is checked by ``rfc3986-validator``, as jsonschema checks
  ``uri``. (``iprivate`` is accepted anywhere, not only in the query.)

No I/O; used inside the workflow sandbox through ``safe_schema``.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from jsonschema import Draft202012Validator, FormatChecker

from aiworker.schemas.patterns import PatternError, compile_pattern

# RFC 3987 section 2.2: the non-ASCII characters an IRI may hold (ucschar and
# iprivate). One character class, so the search is linear.
_SUPPLEMENTARY = "".join(f"\\U{p:04x}0000-\\U{p:04x}fffd" for p in range(0x1, 0xE))
_NOT_IRI = re.compile(
    "[^\\x00-\\x7f\\u00a0-\\ud7ff\\ue000-\\ufdcf\\ufdf0-\\uffef"
    f"{_SUPPLEMENTARY}\\U000e1000-\\U000efffd\\U000f0000-\\U000ffffd\\U00100000-\\U0010fffd]"
)
_ASCII = "".join(map(chr, range(128)))


def _is_regex(instance: object) -> bool:
    if isinstance(instance, str):
        compile_pattern(instance)
    return True


def _as_uri(iri: str) -> str | None:
    """The URI an IRI maps to, or None when it holds a character no IRI may hold."""
    if _NOT_IRI.search(iri):
        return None
    return quote(iri, safe=_ASCII)


def formats() -> FormatChecker:
    """A fresh format checker: jsonschema's 2020-12 one with the checks above."""
    checker = FormatChecker(formats=())
    checker.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
    checker.checks("regex", raises=PatternError)(_is_regex)
    try:
        from rfc3986_validator import validate_rfc3986  # type: ignore[import-untyped]  # no stubs
    except ImportError:  # pragma: no cover - jsonschema[format-nongpl] brings it
        for name in ("iri", "iri-reference"):
            checker.checkers.pop(name, None)
        return checker

    def is_iri(instance: object) -> bool:
        if not isinstance(instance, str):
            return True
        uri = _as_uri(instance)
        return uri is not None and bool(validate_rfc3986(uri, rule="URI"))

    def is_iri_reference(instance: object) -> bool:
        if not isinstance(instance, str):
            return True
        uri = _as_uri(instance)
        return uri is not None and bool(validate_rfc3986(uri, rule="URI_reference"))

    checker.checks("iri")(is_iri)
    checker.checks("iri-reference")(is_iri_reference)
    return checker


__all__ = ["formats"]
