"""Text to typed values for extracted fields: numbers, booleans, dates, URLs.

Each conversion returns a value or raises ``ValueError``; locales decide the
decimal separator and day-first dates.
"""

from __future__ import annotations

import re
from datetime import date, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin

from aiworker.schemas.extraction_spec import FieldSpec

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
