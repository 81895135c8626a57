"""Extraction specs: the checked, compiled form of ``extraction_spec``.

A spec is compiled once (:func:`compile_spec`: selectors, regexes, types and
locales checked; a ``regex`` runs on RE2, in linear time), so a bad spec is
``invalid_input`` before any fetch, and
reused across pages by :class:`~aiworker.activities.tools.extract.HtmlParser`.

It lives in ``schemas/`` so that the pipeline check compiles a step's selectors
before anything runs, at workflow start too (soupsieve is pure Python and
keeps no state between compiles; the sandbox passes it through).

soupsieve (and the beautifulsoup4 it imports) come with the 'scrape' extra and
are imported at the first selector: a process without them (a core install)
checks everything else in a spec and leaves the selector's syntax to the
web-scrape worker, which compiles the spec again before it fetches.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from temporalio import workflow

from aiworker.schemas.messages import suggest, with_suggestion
from aiworker.schemas.patterns import PatternError, compile_pattern

TYPES = frozenset({"string", "integer", "number", "boolean", "date", "datetime", "url"})
_FIELD_KEYS = frozenset(
    {"selector", "attr", "html", "type", "many", "required", "default", "regex", "locale", "fields"}
)
_LOCALE = re.compile(r"^[A-Za-z_-]+$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
# Locales (language part) that write 1.299,00: decimal comma.


class SpecError(ValueError):
    """An extraction spec that cannot be applied; ``path`` names the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True)
class FieldSpec:
    """One compiled field."""

    name: str
    selector: str | None
    compiled: Any
    attr: str | None
    html: bool
    type: str
    many: bool
    required: bool
    has_default: bool
    default: Any
    regex: Any  # an RE2 pattern (aiworker.schemas.patterns), or None
    locale: str | None
    fields: tuple[FieldSpec, ...] | None


CONTENT_MODES = ("article", "page")
# Far above any article; a bound so that a typo cannot ask for gigabytes.
MAX_CONTENT_CHARS = 10_000_000


@dataclass(frozen=True)
class CompiledSpec:
    """A checked extraction spec, reusable across pages."""

    fields: tuple[FieldSpec, ...]
    metadata: bool
    content: str | None = None
    max_content_chars: int | None = None


def compile_spec(spec: Any, path: str = "extraction_spec") -> CompiledSpec:
    """Check and compile an extraction spec; ``SpecError`` names the bad field."""
    if not isinstance(spec, dict):
        raise SpecError(path, "must be an object")
    _refuse_unknown(spec, {"fields", "metadata", "content", "max_content_chars"}, path)
    fields = spec.get("fields", {})
    metadata = spec.get("metadata", False)
    if not isinstance(metadata, bool):
        raise SpecError(f"{path}.metadata", "must be a boolean")
    content, max_chars = _content(spec, path)
    if not fields and not metadata and content is None:
        raise SpecError(path, 'needs at least one field, metadata: true or content: "article"')
    for key, on in (("metadata", metadata), ("content", content is not None)):
        if on and isinstance(fields, dict) and key in fields:
            raise SpecError(f"{path}.fields.{key}", f"is reserved for {key} (data.{key})")
    return CompiledSpec(
        fields=_compile_fields(fields, f"{path}.fields"),
        metadata=metadata,
        content=content,
        max_content_chars=max_chars,
    )


def _content(spec: dict[str, Any], path: str) -> tuple[str | None, int | None]:
    """``content`` (``"article"`` | ``"page"`` | absent) and ``max_content_chars``."""
    content = spec.get("content")
    if content is not None and content not in CONTENT_MODES:
        message = with_suggestion(
            f'must be "article" or "page", not {json.dumps(content)}',
            suggest(content, CONTENT_MODES) if isinstance(content, str) else None,
        )
        raise SpecError(f"{path}.content", message)
    max_chars = spec.get("max_content_chars")
    if max_chars is not None:
        if content is None:
            raise SpecError(f"{path}.max_content_chars", 'needs content: "article" or "page"')
        if isinstance(max_chars, bool) or not isinstance(max_chars, int):
            raise SpecError(f"{path}.max_content_chars", "must be an integer")
        if not 1 <= max_chars <= MAX_CONTENT_CHARS:
            raise SpecError(
                f"{path}.max_content_chars", f"must be between 1 and {MAX_CONTENT_CHARS}"
            )
    return content, max_chars


def _refuse_unknown(spec: dict[str, Any], known: frozenset[str] | set[str], path: str) -> None:
    for key in spec:
        if key not in known:
            message = with_suggestion("unknown key", suggest(str(key), known))
            raise SpecError(f"{path}.{key}", message)


def compile_selector(selector: Any, path: str = "selector") -> Any:
    """A CSS selector compiled by soupsieve (the engine extraction runs on);
    ``SpecError`` at ``path`` when it is empty or invalid."""
    if not isinstance(selector, str) or not selector.strip():
        raise SpecError(path, "must be a non-empty CSS selector")
    try:
        # passed through: inside a workflow, the sandbox would import soupsieve and
        # beautifulsoup4 afresh for every run
        with workflow.unsafe.imports_passed_through():
            import soupsieve
    except ImportError:  # no 'scrape' extra here: the web-scrape worker checks it
        return None
    try:
        return soupsieve.compile(selector)
    except Exception as e:  # soupsieve raises SelectorSyntaxError and others
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(path, f"invalid CSS selector {json.dumps(selector)}: {first}") from None


def _compile_fields(fields: Any, path: str) -> tuple[FieldSpec, ...]:
    if not isinstance(fields, dict):
        raise SpecError(path, "must be an object of fields")
    return tuple(_compile_field(name, f, f"{path}.{name}") for name, f in fields.items())


def _compile_field(name: str, f: Any, path: str) -> FieldSpec:
    if not _NAME.match(name):
        raise SpecError(path, "field names are letters, digits, '_' and '-'")
    if isinstance(f, str):
        f = {"selector": f}
    if not isinstance(f, dict):
        raise SpecError(path, "must be an object or a selector string")
    _refuse_unknown(f, _FIELD_KEYS, path)
    selector = f.get("selector")
    compiled = None
    if selector is not None:
        compiled = compile_selector(selector, f"{path}.selector")
    ftype = f.get("type", "string")
    if ftype not in TYPES:
        raise SpecError(f"{path}.type", f"{ftype!r} is not one of {sorted(TYPES)}")
    attr = f.get("attr")
    if attr is not None and (not isinstance(attr, str) or not attr):
        raise SpecError(f"{path}.attr", "must be an attribute name")
    html = f.get("html", False)
    if attr is not None and html:
        raise SpecError(path, "attr and html exclude each other")
    regex = None
    if f.get("regex") is not None:
        try:
            regex = compile_pattern(f["regex"])
        except PatternError as e:
            raise SpecError(f"{path}.regex", str(e)) from None
    locale = f.get("locale")
    if locale is not None and not (isinstance(locale, str) and _LOCALE.match(locale)):
        raise SpecError(f"{path}.locale", "must be a locale tag such as 'de-DE'")
    sub = None
    if "fields" in f:
        if attr is not None or html or regex is not None or ftype != "string":
            raise SpecError(path, "a record (fields) takes no attr, html, regex or type")
        sub = _compile_fields(f["fields"], f"{path}.fields")
    for key in ("many", "required"):
        if not isinstance(f.get(key, False), bool):
            raise SpecError(f"{path}.{key}", "must be a boolean")
    return FieldSpec(
        name=name,
        selector=selector,
        compiled=compiled,
        attr=attr,
        html=bool(html),
        type=ftype,
        many=bool(f.get("many", False)),
        required=bool(f.get("required", False)),
        has_default="default" in f,
        default=f.get("default"),
        regex=regex,
        locale=locale.lower().replace("_", "-") if locale else None,
        fields=sub,
    )
