"""Validation errors in JSON terms: the one formatter for every message a user reads.

jsonschema and pydantic describe a failure in Python terms (``None is not of
type 'number'``, ``{'selector': '.product', ...} is not valid under any of the
given schemas``, ``Input should be a valid dictionary``). Users write JSON, so
every message that reaches them goes through here and speaks JSON: a JSON path
(``$.fields.price``), JSON type names (``null``, ``object``, ``array``,
``number``) and JSON-encoded values, truncated when long.

- :func:`issues` turns one jsonschema ``ValidationError`` into what is wrong
  and where; an ``anyOf``/``oneOf`` error descends into its ``context`` to the
  most relevant sub-error (jsonschema's ``relevance``), so a misspelled key
  deep in one branch is named, and an unknown key carries a close match.
- :func:`format_error` is that as one line, ``<json path>: <message>``;
  :func:`reasons` the machine-readable list the runtime and the validator
  worker return.
- :func:`pydantic_issues` does the same for a pydantic ``ValidationError``.

Pure functions; the workflow sandbox passes this module through.
"""

from __future__ import annotations

import difflib
import heapq
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError, _Error, relevance

from aiworker.schemas.patterns import compile_pattern, search

# A value quoted in a message is cut after this many characters of its JSON.
MAX_VALUE_CHARS = 80
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_REQUIRED = re.compile(r"^('.*') is a required property$")
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=repr)


def json_text(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """``value`` as compact JSON, cut to ``limit`` characters (``...`` marks the cut).

    Encodes only as much as it shows, so a huge value costs no more than its cut.
    """
    out: list[str] = []
    size = 0
    for chunk in _ENCODER.iterencode(value):
        out.append(chunk)
        size += len(chunk)
        if size > limit:
            return "".join(out)[:limit] + "..."
    return "".join(out)


def type_name(value: Any) -> str:
    """The JSON type of a decoded value: ``null``, ``boolean``, ``integer``, ``number``,
    ``string``, ``array`` or ``object``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def json_path(parts: Iterable[Any], root: str = "$") -> str:
    """``['items', 0, 'name']`` -> ``$.items[0].name``; a key that is no identifier is
    quoted (``$["a b"]``). ``root=""`` gives a suffix for a field name."""
    out = root
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _IDENT.match(str(p)):
            out += f".{p}" if out else str(p)
        else:
            out += f"[{json.dumps(str(p), ensure_ascii=False)}]"
    return out


def suggest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (a misspelled key or name), if one is close."""
    found = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return found[0] if found else None


def with_suggestion(message: str, suggestion: str | None) -> str:
    """``message`` with ``(did you mean 'x'?)`` when there is a suggestion."""
    return f"{message} (did you mean {suggestion!r}?)" if suggestion else message


@dataclass(frozen=True)
class Issue:
    """One thing wrong with a value: where (path parts), what, and a close match."""

    path: tuple[str | int, ...]
    message: str
    keyword: str
    schema_path: str = ""
    suggestion: str | None = None

    @property
    def text(self) -> str:
        """The message with its suggestion."""
        return with_suggestion(self.message, self.suggestion)


# --- jsonschema --------------------------------------------------------------------------------

# A ValidationError, or a SchemaError (a schema's error under the metaschema).
Keep = Callable[[_Error], bool]


def _keep_all(_: _Error) -> bool:
    return True


def _relevance(e: _Error) -> tuple[Any, ...]:
    # Between branches failing alike, one that failed only on its ``type`` was meant
    # for another shape of value: the other branch says what is wrong.
    # jsonschema types the key as a ValidationError's; it reads what every error has.
    ranked: Any = relevance(e)  # type: ignore[arg-type]
    return (*ranked, e.validator == "type")


def leaf(error: _Error, keep: Keep = _keep_all) -> _Error:
    """The most relevant sub-error of an ``anyOf``/``oneOf`` error (the error itself for
    any other keyword, or when its branches fail equally): jsonschema's
    ``best_match`` descent, over the sub-errors ``keep`` accepts."""
    best = error
    while best.context:
        kept = [c for c in best.context if keep(c)]
        smallest = heapq.nsmallest(2, kept, key=_relevance)
        if not smallest or (
            len(smallest) == 2 and _relevance(smallest[0]) == _relevance(smallest[1])
        ):
            break
        best = smallest[0]
    return best


def _types(expected: Any) -> str:
    names = [expected] if isinstance(expected, str) else list(expected)
    return " or ".join(str(n) for n in names)


def _message(e: _Error) -> str:
    """What one (leaf) error says, in JSON terms, without its path."""
    v, value, instance = e.validator, e.validator_value, e.instance
    shown = json_text(instance)
    messages: dict[Any, Callable[[], str]] = {
        "type": lambda: f"{shown} is not of type {_types(value)}",
        "enum": lambda: f"{shown} is not one of {json_text(value)}",
        "const": lambda: f"{shown} is not {json_text(value)}",
        "minLength": lambda: f"{shown} is shorter than {value} characters",
        "maxLength": lambda: f"{shown} is longer than {value} characters",
        "minimum": lambda: f"{shown} is less than the minimum of {json_text(value)}",
        "maximum": lambda: f"{shown} is greater than the maximum of {json_text(value)}",
        "exclusiveMinimum": lambda: f"{shown} is not greater than {json_text(value)}",
        "exclusiveMaximum": lambda: f"{shown} is not less than {json_text(value)}",
        "multipleOf": lambda: f"{shown} is not a multiple of {json_text(value)}",
        "pattern": lambda: f"{shown} does not match the pattern {json_text(value)}",
        "format": lambda: f"{shown} is not a valid {value}",
        "minItems": lambda: f"{shown} has fewer than {value} items",
        "maxItems": lambda: f"{shown} has more than {value} items",
        "uniqueItems": lambda: f"{shown} has repeated items",
        "minProperties": lambda: f"{shown} has fewer than {value} keys",
        "maxProperties": lambda: f"{shown} has more than {value} keys",
        "contains": lambda: f"{shown} has no item that matches {json_text(value)}",
        "not": lambda: f"{shown} must not match {json_text(value)}",
        "anyOf": lambda: f"{shown} does not match any of the allowed forms",
        "oneOf": lambda: (
            f"{shown} matches more than one of the allowed forms"
            if not e.context
            else f"{shown} does not match any of the allowed forms"
        ),
        False: lambda: f"{shown} is not allowed here",
    }
    make = messages.get(v)
    if make is not None:
        return make()
    if v == "required":
        # jsonschema reports each missing key as an error of its own, named in its text.
        m = _REQUIRED.match(e.message)
        return f"missing required key {m.group(1) if m else json_text(value)}"
    # Any other keyword: jsonschema's text, its value's Python repr made JSON.
    return e.message.replace(repr(instance), shown)


def additional_keys(instance: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The keys of ``instance`` that ``schema``'s ``properties`` and ``patternProperties``
    do not name (those ``additionalProperties`` applies to)."""
    properties = schema.get("properties", {})
    regexes = [compile_pattern(p) for p in schema.get("patternProperties", {})]
    return [
        p
        for p in instance
        if p not in properties and not any(search(r, p) is not None for r in regexes)
    ]


def _extra_keys(e: _Error) -> list[str]:
    if not isinstance(e.instance, Mapping) or not isinstance(e.schema, Mapping):
        return []
    return additional_keys(dict(e.instance), dict(e.schema))


def issues(error: _Error, keep: Keep = _keep_all) -> list[Issue]:
    """What ``error`` says is wrong, in JSON terms: its most relevant leaf (:func:`leaf`),
    one issue per unknown key (with a close known key as suggestion)."""
    e = leaf(error, keep)
    path = tuple(e.absolute_path)
    schema_path = "/".join(str(p) for p in e.absolute_schema_path)
    v = str(e.validator)
    if e.validator == "additionalProperties" and e.validator_value is False:
        schema = e.schema if isinstance(e.schema, Mapping) else {}
        known = [str(k) for k in (schema.get("properties") or {})]
        extras = _extra_keys(e)
        if extras:
            return [
                Issue((*path, k), "unknown key", v, schema_path, suggest(k, known)) for k in extras
            ]
    return [Issue(path, _message(e), v, schema_path)]


def format_error(error: _Error, root: str = "$") -> str:
    """One line for ``error``: ``<json path>: <message>``, e.g.
    ``$.price: null is not of type number``."""
    first = issues(error)[0]
    return f"{json_path(first.path, root)}: {first.text}"


def reasons(errors: Sequence[ValidationError], limit: int = 100) -> list[dict[str, str]]:
    """Validation errors as machine-actionable reasons ``{path, message, validator,
    schema_path}``, in path order, at most ``limit``."""
    found = [i for e in errors for i in issues(e)]
    found.sort(key=lambda i: ([str(p) for p in i.path], i.keyword))
    return [
        {
            "path": json_path(i.path),
            "message": i.text,
            "validator": i.keyword,
            "schema_path": i.schema_path,
        }
        for i in found[:limit]
    ]


# --- pydantic ----------------------------------------------------------------------------------

_PYDANTIC_TYPES = {
    "string": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "dict": "an object",
    "model": "an object",
    "model_attributes": "an object",
    "list": "an array",
    "tuple": "an array",
    "none": "null",
}


def _walk(raw: Any, loc: Sequence[Any]) -> tuple[bool, Any]:
    cur = raw
    for p in loc:
        if isinstance(cur, Mapping) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and isinstance(p, int) and 0 <= p < len(cur):
            cur = cur[p]
        else:
            return False, None
    return True, cur


def _expected(err: Mapping[str, Any]) -> str | None:
    kind = str(err["type"])
    for suffix in ("_type", "_parsing"):
        if kind.endswith(suffix):
            return _PYDANTIC_TYPES.get(kind.removesuffix(suffix))
    return None


def pydantic_issues(
    errors: Sequence[Mapping[str, Any]],
    raw: Any,
    known_keys: Callable[[tuple[Any, ...]], Iterable[str]] = lambda _: (),
) -> list[Issue]:
    """pydantic's ``e.errors()`` for the document ``raw``, in JSON terms.

    A union's member tags (``for_each.str``, ``for_each.list[any]``) are dropped
    from the path and its type errors merged (``must be a string or an array, not
    number 5``); ``known_keys(path)`` names the keys allowed where an unknown key
    stands, for a suggestion.
    """
    merged: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for err in errors:
        loc = tuple(err["loc"])
        # Union member tags are path segments that are no place in the document.
        while err["type"] != "missing" and len(loc) > 1 and not _walk(raw, loc)[0]:
            loc = loc[:-1]
        merged.setdefault(loc, []).append(err)
    out: list[Issue] = []
    for loc, errs in merged.items():
        first = errs[0]
        kind = str(first["type"])
        if kind == "extra_forbidden":
            key = str(loc[-1])
            out.append(
                Issue(loc, "unknown key", kind, suggestion=suggest(key, known_keys(loc[:-1])))
            )
            continue
        if kind == "missing":
            out.append(Issue(loc, "missing (required)", kind))
            continue
        value = _walk(raw, loc)[1]
        expected = [x for x in (_expected(e) for e in errs) if x]
        if len(expected) == len(errs):
            message = f"must be {' or '.join(dict.fromkeys(expected))}, not {type_name(value)}"
            if value is not None:
                message += f" {json_text(value)}"
        else:
            msg = str(first["msg"]).removeprefix("Value error, ")
            msg = msg.replace("Input should be", "must be")
            if kind == "literal_error":
                msg = re.sub(r"'([^']*)'", lambda m: json.dumps(m.group(1)), msg)
            message = f"{msg}, got {json_text(value)}" if kind != "value_error" else msg
        out.append(Issue(loc, message, kind))
    return out


__all__ = [
    "MAX_VALUE_CHARS",
    "Issue",
    "format_error",
    "issues",
    "json_path",
    "json_text",
    "leaf",
    "pydantic_issues",
    "reasons",
    "suggest",
    "type_name",
    "with_suggestion",
]
