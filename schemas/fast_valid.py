"""A fast "surely valid" check for plain JSON schemas, in front of jsonschema.

A worker call checks its input and its output against the spec's schemas; on
a page of a crawl that was about 180 us of the runtime's ~380 us per call
(``jsonschema`` walks a value with a validator object per level). Most values
pass, and most specs' schemas use a handful of keywords. :func:`compile_fast`
turns such a schema into nested closures that answer one question: is the
value valid? ``True`` means jsonschema (the safe validator of
:mod:`aiworker.schemas.safe_schema`: Draft 2020-12, RE2 patterns, format
checks) would find no error; ``False`` means "not sure", and the caller asks
jsonschema, whose errors are the answer. So only a ``True`` must be exact, and
the check is conservative wherever the two could differ:

- keywords: ``type``, ``properties``, ``required``, ``additionalProperties``,
  ``items`` (one schema), ``minimum``/``maximum`` and the exclusive pair,
  ``minLength``/``maxLength``, ``minItems``/``maxItems``, ``pattern``,
  ``format``, ``enum`` of strings, boolean schemas, and annotations; a schema with any other
  keyword anywhere (``$ref``, ``anyOf``, ``const``, ...) gets no fast check;
- values: only ``dict`` (``str`` keys), ``list``, ``str``, ``int``, finite
  ``float``, ``bool`` and ``None``, by exact type; anything else (a tuple, a
  subclass, a NaN, an integral float under ``"integer"``) is "not sure";
- ``pattern`` and ``format`` call the very functions the safe validator calls
  (:func:`~aiworker.schemas.patterns.search`, ``FORMATS.conforms``).

``tests/schemas/test_fast_valid.py`` holds it to jsonschema on generated
schemas and values. Why not fastjsonschema: it runs patterns with Python's
``re`` (the safe validator runs user patterns on RE2, linear time), and its
answers are not jsonschema's in the corners above.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from aiworker.schemas.patterns import PatternError, compile_pattern, search

Check = Callable[[Any], bool]

# Keywords that never change whether a value is valid.
ANNOTATIONS = frozenset(
    {
        "$schema",
        "$comment",
        "$defs",
        "definitions",
        "title",
        "description",
        "examples",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_KEYWORDS = ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "format",
    "enum",
}


def _number(v: Any) -> bool:
    t = type(v)
    return t is int or (t is float and math.isfinite(v))


# Exact types only: a value of any other type is "not sure" under every type.
_TYPES: dict[str, Check] = {
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "string": lambda v: type(v) is str,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "integer": lambda v: type(v) is int,
    "number": _number,
}
_PLAIN = (dict, list, str, int, bool, type(None))


def _plain(v: Any) -> bool:
    """A value whose type the checks know (containers are checked as they are walked)."""
    t = type(v)
    return t in _PLAIN or (t is float and math.isfinite(v))


def compile_fast(schema: Any, formats: Any) -> Check | None:
    """``schema``'s fast check (``formats``: the safe validator's format checker), or
    None when the schema uses anything the check does not cover."""
    try:
        return _compile(schema, formats, 0)
    except _Unsupported:
        return None


class _Unsupported(Exception):
    pass


def _compile(schema: Any, formats: Any, depth: int) -> Check:
    if schema is True:
        return _plain
    if schema is False or depth > 64 or type(schema) is not dict:
        raise _Unsupported
    if not set(schema) <= _KEYWORDS:
        raise _Unsupported
    checks: list[Check] = [_plain]
    if "type" in schema:
        names = schema["type"]
        names = [names] if type(names) is str else names
        if type(names) is not list or not names or not all(n in _TYPES for n in names):
            raise _Unsupported
        preds = [_TYPES[n] for n in names]
        checks.append(preds[0] if len(preds) == 1 else lambda v: any(p(v) for p in preds))
    checks += _object_checks(schema, formats, depth)
    checks += _scalar_checks(schema, formats)
    if "items" in schema:
        item = _compile(schema["items"], formats, depth + 1)
        checks.append(lambda v: type(v) is not list or all(item(x) for x in v))
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(c(v) for c in checks)


def _object_checks(schema: dict[str, Any], formats: Any, depth: int) -> list[Check]:
    checks: list[Check] = []
    props = schema.get("properties", {})
    if type(props) is not dict:
        raise _Unsupported
    subs = {k: _compile(s, formats, depth + 1) for k, s in props.items()}
    required = schema.get("required", [])
    if type(required) is not list or not all(type(k) is str for k in required):
        raise _Unsupported
    extra = schema.get("additionalProperties", True)
    rest = None if extra is False else _compile(extra, formats, depth + 1)

    def object_ok(v: Any) -> bool:
        if type(v) is not dict:
            return True
        for k, x in v.items():
            if type(k) is not str:
                return False
            sub = subs.get(k, rest)
            if sub is None or not sub(x):
                return False
        return all(k in v for k in required)

    if subs or required or "additionalProperties" in schema:
        checks.append(object_ok)
    return checks


def _bound(schema: dict[str, Any], key: str) -> Any:
    value = schema[key]
    if not _number(value):
        raise _Unsupported
    return value


_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {
    "minimum": operator.ge,
    "maximum": operator.le,
    "exclusiveMinimum": operator.gt,
    "exclusiveMaximum": operator.lt,
}
_LENGTHS: dict[str, tuple[type, Callable[[Any, Any], bool]]] = {
    "minLength": (str, operator.ge),
    "maxLength": (str, operator.le),
    "minItems": (list, operator.ge),
    "maxItems": (list, operator.le),
}


def _bound_check(holds: Callable[[Any, Any], bool], bound: Any) -> Check:
    return lambda v: not _number(v) or holds(v, bound)


def _length_check(kind: type, holds: Callable[[Any, Any], bool], bound: int) -> Check:
    def check(v: Any) -> bool:
        sized: Any = v  # a str or a list when it is of ``kind``
        return type(v) is not kind or holds(len(sized), bound)

    return check


def _scalar_checks(schema: dict[str, Any], formats: Any) -> list[Check]:
    checks: list[Check] = []
    for key, holds in _BOUNDS.items():
        if key in schema:
            checks.append(_bound_check(holds, _bound(schema, key)))
    for key, (kind, holds) in _LENGTHS.items():
        if key in schema:
            b = schema[key]
            if type(b) is not int or b < 0:
                raise _Unsupported
            checks.append(_length_check(kind, holds, b))
    if "enum" in schema:
        members = schema["enum"]
        if type(members) is not list or not all(type(m) is str for m in members):
            raise _Unsupported
        # jsonschema compares a string with ==: sure only of a string in the list
        allowed = frozenset(members)
        checks.append(lambda v: type(v) is str and v in allowed)
    if "pattern" in schema:
        try:
            regex = compile_pattern(schema["pattern"])
        except (PatternError, TypeError):
            raise _Unsupported from None
        checks.append(lambda v: type(v) is not str or search(regex, v) is not None)
    if "format" in schema:
        name = schema["format"]
        if type(name) is not str:
            raise _Unsupported
        checks.append(lambda v: formats.conforms(v, name))
    return checks


__all__ = ["ANNOTATIONS", "Check", "compile_fast"]
