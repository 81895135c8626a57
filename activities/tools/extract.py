"""The ``parse_html`` tool: the ``extraction_spec`` engine.

A spec is compiled once (:func:`compile_spec`: selectors, regexes, types and
locales checked, so a bad spec is ``invalid_input`` before any fetch) and
applied to a page (:meth:`HtmlParser.extract`). Extraction never raises on
any HTML: a field that is not found, or whose text does not convert to its
type, becomes its ``default`` (or ``null``; ``[]`` for ``many``) plus a
warning naming the field and selector. A missing ``required`` field makes the
result ``partial``.

Per field: ``selector`` (CSS; none means the current element), ``attr`` or
``html`` (inner HTML) instead of normalized text, ``many``, ``required``,
``default``, ``regex`` (the first capture group if it has one), ``type``
(string, integer, number, boolean, date, datetime, url), ``locale`` for
numbers and dates, and ``fields`` for nested records under a container.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urljoin

from bs4 import BeautifulSoup, Tag

from aiworker.activities.tools.convert import convert, parse_boolean
from aiworker.schemas.caps import DEFAULT_MAX_JSON_DEPTH
from aiworker.schemas.extraction_spec import (
    CompiledSpec,
    FieldSpec,
    compile_spec,
)
from aiworker.schemas.patterns import first_group
from aiworker.schemas.refs import ReferenceLimitError, json_depth

if TYPE_CHECKING:
    from aiworker.activities.tools.lxml_tree import LxmlPage

try:  # lxml is the fastest parser bs4 supports; html.parser is the fallback.
    import lxml  # type: ignore[import-untyped]  # noqa: F401

    PARSER = "lxml"
except ImportError:  # pragma: no cover
    PARSER = "html.parser"


# Elements come only from tags: no "<base" in the text, no <base> in the tree.
_BASE_TAG = re.compile(r"<base", re.IGNORECASE)


@dataclass
class Extraction:
    """Extracted data, warnings, and the required fields that are missing."""

    data: dict[str, Any]
    warnings: list[dict[str, str]] = field(default_factory=list)
    missing_required: list[str] = field(default_factory=list)


def normalize_text(el: Tag) -> str:
    """Visible text with runs of whitespace collapsed."""
    return " ".join(el.get_text(" ").split())


class HtmlParser:
    """Parses pages and applies compiled extraction specs (stateless, shareable).

    Args:
        max_json_depth: JSON-LD blocks nested deeper are skipped with a warning
            (``AIWORKER_MAX_JSON_DEPTH``).
    """

    parser = PARSER

    def __init__(self, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH) -> None:
        self.max_json_depth = max_json_depth

    def compile(self, spec: Any) -> CompiledSpec:
        """Check an ``extraction_spec``; ``SpecError`` names the bad field."""
        return compile_spec(spec)

    def parse(self, text: str) -> BeautifulSoup:
        return BeautifulSoup(text, self.parser)

    def parse_lxml(self, text: str) -> LxmlPage | None:
        """lxml's own tree of ``text`` (:mod:`~aiworker.activities.tools.lxml_tree`),
        or None where it would not answer as BeautifulSoup's tree does."""
        if self.parser != "lxml":
            return None
        from aiworker.activities.tools.lxml_tree import parse

        return parse(text)

    def extract(self, text: str, spec: CompiledSpec, base_url: str) -> Extraction:
        """Apply ``spec`` to the page ``text`` fetched from ``base_url``: on lxml's own
        tree when the spec means the same there (:func:`~aiworker.activities.tools.
        lxml_tree.serves`: simple selectors, no inner HTML, no metadata), which costs
        about an eighth of building BeautifulSoup's and applying it there; else on
        BeautifulSoup's."""
        if self.parser == "lxml":
            from aiworker.activities.tools.lxml_tree import serves

            page = self.parse_lxml(text) if serves(spec) else None
            if page is not None:
                base = page.base_href() if _BASE_TAG.search(text) else None
                if base is not None:
                    base_url = urljoin(base_url, base)
                out = Extraction(data={})
                out.data = _record(page, page, spec.fields, base_url, "", out)
                return out
        return self.extract_from(self.parse(text), spec, base_url, source=text)

    def extract_from(
        self, soup: BeautifulSoup, spec: CompiledSpec, base_url: str, *, source: str | None = None
    ) -> Extraction:
        """Apply ``spec`` to a page already parsed (:meth:`parse`); reads, never changes it.

        ``source`` is the text ``soup`` was parsed from, when known: a page whose
        text never says ``<base`` has no ``<base>`` element, and the walk of the
        whole tree looking for one is skipped.
        """
        if source is None or _BASE_TAG.search(source):
            base = soup.find("base", href=True)
            if isinstance(base, Tag):
                base_url = urljoin(base_url, str(base["href"]))
        out = Extraction(data={})
        out.data = _record(SOUP, soup, spec.fields, base_url, "", out)
        if spec.metadata:
            out.data["metadata"] = metadata(soup, base_url, out, self.max_json_depth)
        return out


class Tree(Protocol):
    """What extraction asks of a page's tree: BeautifulSoup's (:data:`SOUP`) or
    lxml's own (:class:`~aiworker.activities.tools.lxml_tree.LxmlPage`)."""

    def select(self, scope: Any, fs: FieldSpec) -> list[Any]:
        """The elements ``fs.selector`` matches under ``scope`` (all for a list or a
        record field, else the first); ``[scope]`` without a selector."""
        ...

    def attr(self, el: Any, name: str) -> str | None:
        """Attribute ``name`` (a multi-valued one's words joined by one space)."""
        ...

    def text(self, el: Any) -> str:
        """The element's text, whitespace collapsed (:func:`normalize_text`)."""
        ...


class _Soup:
    """:class:`Tree` on BeautifulSoup's tree (any selector, inner HTML, metadata)."""

    @staticmethod
    def select(scope: Tag, fs: FieldSpec) -> list[Tag]:
        if fs.compiled is None:
            return [scope]
        if fs.many or fs.fields is not None:
            return list(fs.compiled.select(scope))
        one = fs.compiled.select_one(scope)
        return [one] if one is not None else []

    @staticmethod
    def attr(el: Tag, name: str) -> str | None:
        v = el.get(name)
        if v is None:
            return None
        return " ".join(v) if isinstance(v, list) else str(v)

    @staticmethod
    def text(el: Tag) -> str:
        return normalize_text(el)


SOUP: Tree = _Soup()


def _raw(tree: Tree, el: Any, fs: FieldSpec) -> str | None:
    if fs.html:  # BeautifulSoup's tree only (lxml_tree.serves)
        return str(el.decode_contents()).strip()
    if fs.attr is not None:
        return tree.attr(el, fs.attr)
    if fs.type in ("date", "datetime") and tree.attr(el, "datetime"):
        return tree.attr(el, "datetime")
    if fs.type == "url":
        href = tree.attr(el, "href")
        if href is not None:
            return href
    return tree.text(el)


def _value(tree: Tree, el: Any, fs: FieldSpec, base_url: str) -> tuple[Any, str | None]:
    """``(value, problem)``: problem is ``None`` when the value is good."""
    raw = _raw(tree, el, fs)
    if raw is None:
        return None, f"attribute {fs.attr!r} absent"
    if fs.regex is not None:
        found = first_group(fs.regex, raw)
        if found is None:
            return None, f"regex {fs.regex.pattern!r} did not match {raw[:80]!r}"
        raw = found
    if raw == "" and fs.type != "string":
        return None, "empty text"
    try:
        return convert(raw, fs, base_url), None
    except (ValueError, OverflowError) as e:
        return None, f"not a {fs.type}: {e}"


def _warn(out: Extraction, path: str, fs: FieldSpec, code: str, detail: str) -> None:
    where = f"selector {fs.selector!r}" if fs.selector else "the element itself"
    out.warnings.append(
        {"code": code, "field": path, "message": f"field {path!r} ({where}): {detail}"}
    )
    if fs.required:
        out.missing_required.append(path)


def _record(tree: Tree, scope: Any, fields: tuple[FieldSpec, ...], base_url: str,
            prefix: str, out: Extraction) -> dict[str, Any]:  # fmt: skip
    data: dict[str, Any] = {}
    for fs in fields:
        path = f"{prefix}{fs.name}"
        data[fs.name] = _field(tree, scope, fs, base_url, path, out)
    return data


def _field(tree: Tree, scope: Any, fs: FieldSpec, base_url: str, path: str, out: Extraction) -> Any:
    elements = tree.select(scope, fs)
    if fs.type == "boolean" and not fs.many and fs.attr is None and fs.regex is None:
        # A boolean field answers "is it there?" unless its text says yes or no.
        if not elements:
            return fs.default if fs.has_default else False
        try:
            return parse_boolean(tree.text(elements[0]))
        except ValueError:
            return True
    if not elements:
        if fs.has_default:
            return fs.default
        _warn(out, path, fs, "field_missing", "no element matched")
        return [] if fs.many else None
    if fs.fields is not None:
        if not fs.many:
            return _record(tree, elements[0], fs.fields, base_url, f"{path}.", out)
        before = len(out.warnings)
        records = [_record(tree, el, fs.fields, base_url, f"{path}[].", out) for el in elements]
        _collapse(out, before, len(records))
        return records
    if not fs.many:
        value, problem = _value(tree, elements[0], fs, base_url)
        if problem is None:
            return value
        if fs.has_default:
            return fs.default
        _warn(out, path, fs, "field_unparseable", problem)
        return None
    values: list[Any] = []
    problems: list[str] = []
    for el in elements:
        value, problem = _value(tree, el, fs, base_url)
        if problem is None:
            values.append(value)
        else:
            problems.append(problem)
    if problems:
        _warn(
            out,
            path,
            fs,
            "field_unparseable",
            f"{len(problems)} of {len(elements)} matches skipped; first: {problems[0]}",
        )
        if values:
            # Some items converted: the list is usable, so it is not "missing".
            if fs.required:
                out.missing_required.pop()
    return values


def _collapse(out: Extraction, start: int, count: int) -> None:
    """One warning per nested field path, not one per record."""
    fresh = out.warnings[start:]
    if not fresh:
        return
    merged: dict[str, dict[str, str]] = {}
    counts: dict[str, int] = {}
    for w in fresh:
        key = w["field"]
        counts[key] = counts.get(key, 0) + 1
        merged.setdefault(key, dict(w))
    del out.warnings[start:]
    for key, w in merged.items():
        w["message"] += f" (in {counts[key]} of {count} records)"
        out.warnings.append(w)
    seen: set[str] = set()
    kept: list[str] = []
    for p in out.missing_required:
        if p not in seen:
            seen.add(p)
            kept.append(p)
    out.missing_required[:] = kept


def metadata(
    soup: BeautifulSoup, base_url: str, out: Extraction, max_json_depth: int
) -> dict[str, Any]:
    """Title, description, canonical URL, language, OpenGraph and JSON-LD of a page."""

    def meta(key: str, pattern: str) -> str | None:
        el = soup.find("meta", attrs={key: re.compile(pattern, re.I)})
        if isinstance(el, Tag) and el.get("content") is not None:
            return " ".join(str(el["content"]).split())
        return None

    title_el = soup.find("title")
    canonical = None
    for link in soup.find_all("link", href=True):
        rel: Any = link.get("rel") or []
        rels = rel if isinstance(rel, list) else str(rel).split()
        if "canonical" in [r.lower() for r in rels]:
            canonical = urljoin(base_url, str(link["href"]).strip())
            break
    html_el = soup.find("html")
    language = None
    if isinstance(html_el, Tag) and html_el.get("lang"):
        language = str(html_el["lang"]).strip()
    language = language or meta("http-equiv", "^content-language$")
    opengraph: dict[str, Any] = {}
    for el in soup.find_all("meta", attrs={"property": re.compile(r"^og:", re.I)}):
        key = str(el["property"])[3:].lower()
        content = el.get("content")
        if content is None or not key:
            continue
        value = " ".join(str(content).split())
        if key in ("image", "url", "image:url", "image:secure_url", "video", "audio"):
            value = urljoin(base_url, value)
        if key in opengraph:  # repeated properties (several images) become lists
            prev = opengraph[key]
            opengraph[key] = [*prev, value] if isinstance(prev, list) else [prev, value]
        else:
            opengraph[key] = value
    json_ld: list[Any] = []
    for i, script in enumerate(
        soup.find_all("script", attrs={"type": re.compile(r"^application/ld\+json", re.I)})
    ):
        raw = script.string or script.get_text()
        try:
            parsed = json.loads(raw)
            # json.loads recurses per level too: a RecursionError is the same refusal
            json_depth(parsed, max_json_depth)
        except (RecursionError, ReferenceLimitError):
            out.warnings.append(
                {
                    "code": "json_ld_too_deep",
                    "field": f"metadata.json_ld[{i}]",
                    "message": f"JSON-LD block {i} nests deeper than {max_json_depth} "
                    "levels; skipped",
                }
            )
            continue
        except (ValueError, TypeError) as e:
            out.warnings.append(
                {
                    "code": "json_ld_invalid",
                    "field": f"metadata.json_ld[{i}]",
                    "message": f"JSON-LD block {i} is not valid JSON: {e}",
                }
            )
            continue
        json_ld.extend(parsed if isinstance(parsed, list) else [parsed])
    return {
        "title": normalize_text(title_el) if isinstance(title_el, Tag) else None,
        "description": meta("name", "^description$") or opengraph.get("description"),
        "canonical_url": canonical,
        "language": language,
        "opengraph": opengraph,
        "json_ld": json_ld,
    }
