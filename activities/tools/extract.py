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
from datetime import date, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin

import soupsieve
from bs4 import BeautifulSoup, Tag

try:  # lxml is the fastest parser bs4 supports; html.parser is the fallback.
    import lxml  # type: ignore[import-untyped]  # noqa: F401

    PARSER = "lxml"
except ImportError:  # pragma: no cover
    PARSER = "html.parser"

TYPES = frozenset({"string", "integer", "number", "boolean", "date", "datetime", "url"})
_FIELD_KEYS = frozenset(
    {"selector", "attr", "html", "type", "many", "required", "default", "regex", "locale", "fields"}
)
_LOCALE = re.compile(r"^[A-Za-z_-]+$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
# Locales (language part) that write 1.299,00: decimal comma.
_DECIMAL_COMMA = frozenset(
    "de fr es it nl pt ru pl sv da fi nb nn no cs sk sl hr sr bg ro hu tr uk el id vi lt lv et "
    "ca eu gl is be kk az".split()
)
_TRUE = frozenset("true yes y 1 on ja oui si sí да in stock available".split())
_FALSE = frozenset("false no n 0 off nein non нет out of stock unavailable".split())
_NUMBER = re.compile(r"[-\u2212]?\d[\d.,'\s\u00a0\u202f\u2009]*")
_DAYFIRST = frozenset({"de", "fr", "es", "it", "nl", "pt", "ru", "pl", "en-gb", "en-au", "tr"})
_MONTHS = {
    m: i + 1
    for i, names in enumerate(
        [
            "jan january janvier januar enero gennaio",
            "feb february février fevrier februar febrero febbraio",
            "mar march mars märz maerz marzo",
            "apr april avril abril aprile",
            "may mai mayo maggio",
            "jun june juin juni junio giugno",
            "jul july juillet juli julio luglio",
            "aug august août aout agosto",
            "sep sept september septembre septiembre settembre",
            "oct october octobre oktober octubre ottobre",
            "nov november novembre noviembre",
            "dec december décembre decembre dezember diciembre dicembre",
        ]
    )
    for m in names.split()
}


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
    regex: re.Pattern[str] | None
    locale: str | None
    fields: tuple[FieldSpec, ...] | None


@dataclass(frozen=True)
class CompiledSpec:
    """A checked extraction spec, reusable across pages."""

    fields: tuple[FieldSpec, ...]
    metadata: bool


@dataclass
class Extraction:
    """Extracted data, warnings, and the required fields that are missing."""

    data: dict[str, Any]
    warnings: list[dict[str, str]] = field(default_factory=list)
    missing_required: list[str] = field(default_factory=list)


def compile_spec(spec: Any, path: str = "extraction_spec") -> CompiledSpec:
    """Check and compile an extraction spec; ``SpecError`` names the bad field."""
    if not isinstance(spec, dict):
        raise SpecError(path, "must be an object")
    unknown = set(spec) - {"fields", "metadata"}
    if unknown:
        raise SpecError(path, f"unknown keys {sorted(unknown)}")
    fields = spec.get("fields", {})
    metadata = spec.get("metadata", False)
    if not isinstance(metadata, bool):
        raise SpecError(f"{path}.metadata", "must be a boolean")
    if not fields and not metadata:
        raise SpecError(path, "needs at least one field or metadata: true")
    if metadata and isinstance(fields, dict) and "metadata" in fields:
        raise SpecError(f"{path}.fields.metadata", "is reserved for metadata: true")
    return CompiledSpec(fields=_compile_fields(fields, f"{path}.fields"), metadata=metadata)


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
    unknown = set(f) - _FIELD_KEYS
    if unknown:
        raise SpecError(path, f"unknown keys {sorted(unknown)}")
    selector = f.get("selector")
    compiled = None
    if selector is not None:
        if not isinstance(selector, str) or not selector.strip():
            raise SpecError(f"{path}.selector", "must be a non-empty CSS selector")
        try:
            compiled = soupsieve.compile(selector)
        except Exception as e:  # soupsieve raises SelectorSyntaxError and others
            raise SpecError(f"{path}.selector", f"invalid CSS selector {selector!r}: {e}") from None
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
            regex = re.compile(f["regex"])
        except (re.error, TypeError) as e:
            raise SpecError(f"{path}.regex", f"invalid regular expression: {e}") from None
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


def normalize_text(el: Tag) -> str:
    """Visible text with runs of whitespace collapsed."""
    return " ".join(el.get_text(" ").split())


# --- conversions: each returns a value or raises ValueError ---------------


def parse_number(text: str, locale: str | None = None) -> float:
    """A number from text like ``"1,299.00"``, ``"1.299,00 €"``, ``"CHF 1'299.50"``."""
    m = _NUMBER.search(text)
    if not m:
        raise ValueError(f"no number in {text!r}")
    raw = m.group(0).strip()
    negative = raw[0] in "-\u2212"
    digits = re.sub(r"[\s\u00a0\u202f\u2009']", "", raw.lstrip("-\u2212"))
    lang = (locale or "").split("-")[0]
    if lang in _DECIMAL_COMMA:
        decimal = ","
    elif lang:
        decimal = "."
    elif "," in digits and "." in digits:
        decimal = "," if digits.rfind(",") > digits.rfind(".") else "."
    elif digits.count(",") == 1 and len(digits.split(",")[1]) != 3:
        decimal = ","
    else:
        decimal = "."
    thousands = "." if decimal == "," else ","
    digits = digits.replace(thousands, "").replace(decimal, ".").rstrip(".")
    if digits.count(".") > 1:
        raise ValueError(f"ambiguous number {raw!r}")
    value = float(digits)
    return -value if negative else value


def parse_integer(text: str, locale: str | None = None) -> int:
    value = parse_number(text, locale)
    if not value.is_integer():
        raise ValueError(f"{text!r} is not a whole number")
    return int(value)


def parse_boolean(text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean")


def parse_datetime(text: str, locale: str | None = None) -> datetime:
    """A datetime from ISO 8601, RFC 2822, numeric or month-name dates."""
    t = text.strip()
    iso = t.replace("Z", "+00:00") if t.endswith("Z") else t
    try:
        return datetime.fromisoformat(iso)
    except ValueError:
        pass
    try:
        return parsedate_to_datetime(t)
    except (TypeError, ValueError, IndexError):
        pass
    m = re.search(r"(\d{4})[/.-](\d{1,2})[/.-](\d{1,2})", t)
    if m:
        return datetime(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    m = re.search(r"(\d{1,2})[/.-](\d{1,2})[/.-](\d{4})", t)
    if m:
        a, b, y = int(m.group(1)), int(m.group(2)), int(m.group(3))
        dayfirst = (locale or "") in _DAYFIRST or (locale or "").split("-")[0] in _DAYFIRST
        if "." in t[m.start() : m.end()] or a > 12:
            dayfirst = True
        elif b > 12:
            dayfirst = False
        day, month = (a, b) if dayfirst else (b, a)
        return datetime(y, month, day)
    words = re.findall(r"[^\W\d_]+\.?|\d+", t.lower())
    month_name = next((_MONTHS[w.rstrip(".")] for w in words if w.rstrip(".") in _MONTHS), None)
    nums = [int(w) for w in words if w.isdigit()]
    year_num = next((n for n in nums if n > 31), None)
    day_num = next((n for n in nums if 1 <= n <= 31), None)
    if month_name and year_num and day_num:
        return datetime(year_num, month_name, day_num)
    raise ValueError(f"no date in {text!r}")


def convert(value: str, fs: FieldSpec, base_url: str) -> Any:
    """Convert extracted text to the field's type; ``ValueError`` if it does not fit."""
    t = fs.type
    if t == "string":
        return value
    if t == "url":
        v = value.strip()
        if not v or v.startswith(("javascript:", "data:")):
            raise ValueError(f"not a URL: {value!r}")
        return urljoin(base_url, v)
    if t == "number":
        return parse_number(value, fs.locale)
    if t == "integer":
        return parse_integer(value, fs.locale)
    if t == "boolean":
        return parse_boolean(value)
    dt = parse_datetime(value, fs.locale)
    if t == "date":
        return date(dt.year, dt.month, dt.day).isoformat()
    return dt.isoformat()


class HtmlParser:
    """Parses pages and applies compiled extraction specs (stateless, shareable)."""

    parser = PARSER

    def compile(self, spec: Any) -> CompiledSpec:
        """Check an ``extraction_spec``; ``SpecError`` names the bad field."""
        return compile_spec(spec)

    def parse(self, text: str) -> BeautifulSoup:
        return BeautifulSoup(text, self.parser)

    def extract(self, text: str, spec: CompiledSpec, base_url: str) -> Extraction:
        """Apply ``spec`` to the page ``text`` fetched from ``base_url``."""
        soup = self.parse(text)
        base = soup.find("base", href=True)
        if isinstance(base, Tag):
            base_url = urljoin(base_url, str(base["href"]))
        out = Extraction(data={})
        out.data = _record(soup, spec.fields, base_url, "", out)
        if spec.metadata:
            out.data["metadata"] = metadata(soup, base_url, out)
        return out


def _select(scope: Tag, fs: FieldSpec) -> list[Tag]:
    if fs.compiled is None:
        return [scope]
    if fs.many or fs.fields is not None:
        return list(fs.compiled.select(scope))
    one = fs.compiled.select_one(scope)
    return [one] if one is not None else []


def _raw(el: Tag, fs: FieldSpec) -> str | None:
    if fs.html:
        return el.decode_contents().strip()
    if fs.attr is not None:
        v = el.get(fs.attr)
        if v is None:
            return None
        return " ".join(v) if isinstance(v, list) else str(v)
    if fs.type in ("date", "datetime") and el.get("datetime"):
        return str(el["datetime"])
    if fs.type == "url" and el.get("href") is not None:
        return str(el["href"])
    return normalize_text(el)


def _value(el: Tag, fs: FieldSpec, base_url: str) -> tuple[Any, str | None]:
    """``(value, problem)``: problem is ``None`` when the value is good."""
    raw = _raw(el, fs)
    if raw is None:
        return None, f"attribute {fs.attr!r} absent"
    if fs.regex is not None:
        m = fs.regex.search(raw)
        if m is None:
            return None, f"regex {fs.regex.pattern!r} did not match {raw[:80]!r}"
        raw = m.group(1) if fs.regex.groups else m.group(0)
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


def _record(scope: Tag, fields: tuple[FieldSpec, ...], base_url: str, prefix: str,
            out: Extraction) -> dict[str, Any]:  # fmt: skip
    data: dict[str, Any] = {}
    for fs in fields:
        path = f"{prefix}{fs.name}"
        data[fs.name] = _field(scope, fs, base_url, path, out)
    return data


def _field(scope: Tag, fs: FieldSpec, base_url: str, path: str, out: Extraction) -> Any:
    elements = _select(scope, fs)
    if fs.type == "boolean" and not fs.many and fs.attr is None and fs.regex is None:
        # A boolean field answers "is it there?" unless its text says yes or no.
        if not elements:
            return fs.default if fs.has_default else False
        try:
            return parse_boolean(normalize_text(elements[0]))
        except ValueError:
            return True
    if not elements:
        if fs.has_default:
            return fs.default
        _warn(out, path, fs, "field_missing", "no element matched")
        return [] if fs.many else None
    if fs.fields is not None:
        if not fs.many:
            return _record(elements[0], fs.fields, base_url, f"{path}.", out)
        before = len(out.warnings)
        records = [_record(el, fs.fields, base_url, f"{path}[].", out) for el in elements]
        _collapse(out, before, len(records))
        return records
    if not fs.many:
        value, problem = _value(elements[0], fs, base_url)
        if problem is None:
            return value
        if fs.has_default:
            return fs.default
        _warn(out, path, fs, "field_unparseable", problem)
        return None
    values: list[Any] = []
    problems: list[str] = []
    for el in elements:
        value, problem = _value(el, fs, base_url)
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


def metadata(soup: BeautifulSoup, base_url: str, out: Extraction) -> dict[str, Any]:
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
