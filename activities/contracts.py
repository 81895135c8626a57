"""A spec's input contract, compiled once, remembering the parts of inputs it found valid.

Validating an input is jsonschema walking the whole value on every call, and
in a ``for_each`` the big part of it is the same on every item: a web-scrape
step's ``extraction_spec`` (a recursive schema of fields, ``anyOf`` per field)
cost three quarters of the input check while only the ``url`` changed
(``bench/scrape.py``). :class:`Contract` checks such an input in full the first
time, remembers the top-level property values that passed, and checks a later
input whose heavy properties are all remembered against the schema with those
properties' subschemas set to ``true``.

Why that gives the same answer, error for error:

- it applies only to a root schema made of ``type``, ``required``,
  ``properties``, ``additionalProperties`` and annotations (:data:`_ROOT_KEYWORDS`):
  there the errors of ``properties`` are those of each present property's value
  under its own subschema, and nothing else reads those subschemas; a value
  that passed its subschema adds no error, exactly as under ``true``; the other
  properties, and the ``required`` and ``additionalProperties`` checks, run as before;
- validity under a subschema is a function of the JSON value alone (no
  retrieval, formats and RE2 patterns are pure, :mod:`aiworker.schemas.safe_schema`):
  a value is remembered by the sha256 of its canonical JSON, and only when it is
  plain JSON (``dict`` with ``str`` keys, ``list``, ``str``, ``int``, ``float``,
  ``bool``, ``None``), since ``json.dumps`` writes a tuple like a list and a
  number key like a string, which the schema tells apart;
- only a value that passed is remembered (after a check with no error at all),
  and a miss, or a value that is not plain, is a full check as before.

Outputs are not remembered: they differ from call to call. Why not jsonschema's
own caching: it has none for instances. Measured against jsonschema-rs
(``python -m bench.schemas``, ``input_memo``: web-scrape's input with one
extraction spec and a new url per call, one run on a loaded 2-core machine):
a memo hit costs 0.10 of jsonschema's full check (401 against 4,158 us), and
jsonschema-rs checks the whole input in 0.005 of the memo hit's time (2.1 us);
why jsonschema-rs is not the validator all the same:
:mod:`aiworker.schemas.safe_schema`. Bounded: :data:`MAX_REMEMBERED` digests
per contract (least recently used go first), values over :data:`MAX_NODES`
nodes are never remembered.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from aiworker.schemas import safe_schema
from aiworker.schemas.safe_schema import cached_validator

MAX_REMEMBERED = 256
MAX_NODES = 10_000
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
# Root keywords under which a property's errors come from its own subschema only.
_ROOT_KEYWORDS = ANNOTATIONS | {"type", "required", "properties", "additionalProperties"}
# A property subschema with one of these does enough work to be worth remembering.
_COMPOSITE = frozenset(
    {
        "$ref",
        "$dynamicRef",
        "properties",
        "patternProperties",
        "additionalProperties",
        "propertyNames",
        "items",
        "prefixItems",
        "contains",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "if",
        "dependentSchemas",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
_SCALARS = (str, int, float, bool)


class Contract:
    """``schema`` compiled (:attr:`validator`) and :meth:`errors` with the memo above.

    Args:
        schema: a spec's ``input_schema`` (already checked when the spec loaded).
        remember: False for a schema whose values do not repeat (outputs): plain checks.
    """

    def __init__(self, schema: dict[str, Any], *, remember: bool = True) -> None:
        self.schema = schema
        self.validator: Validator = cached_validator(schema)
        self.heavy: tuple[str, ...] = heavy_properties(schema) if remember else ()
        self._shallow: Validator | None = None
        self._valid: OrderedDict[bytes, None] = OrderedDict()

    def errors(self, value: Any) -> list[ValidationError]:
        """Every error of ``value``, as ``safe_schema.errors(self.validator, value)``."""
        digests = self._digests(value) if self.heavy else None
        if digests and all(d in self._valid for d in digests):
            for d in digests:
                self._valid.move_to_end(d)
            return safe_schema.errors(self._shallow_validator(), value)
        found = safe_schema.errors(self.validator, value)
        if digests and not found:
            for d in digests:
                self._valid[d] = None
                self._valid.move_to_end(d)
            while len(self._valid) > MAX_REMEMBERED:
                self._valid.popitem(last=False)
        return found

    def _digests(self, value: Any) -> list[bytes] | None:
        """The digests of ``value``'s heavy properties; None when one is not plain JSON."""
        if type(value) is not dict:
            return None
        out = []
        for name in self.heavy:
            if name not in value:
                continue
            part = value[name]
            if not plain_json(part):
                return None
            text = json.dumps([name, part], sort_keys=True, separators=(",", ":"))
            out.append(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
        return out

    def _shallow_validator(self) -> Validator:
        if self._shallow is None:
            props = self.schema["properties"]
            shallow = {
                **self.schema,
                "properties": {k: True if k in self.heavy else v for k, v in props.items()},
            }
            self._shallow = cached_validator(shallow)
        return self._shallow


def heavy_properties(schema: Any) -> tuple[str, ...]:
    """The properties of a root ``schema`` worth remembering; ``()`` when the root has
    a keyword outside :data:`_ROOT_KEYWORDS` (the memo would not be exact there)."""
    if not isinstance(schema, dict) or not set(schema) <= _ROOT_KEYWORDS:
        return ()
    props = schema.get("properties")
    if not isinstance(props, dict):
        return ()
    return tuple(
        k for k, sub in props.items() if isinstance(sub, dict) and not _COMPOSITE.isdisjoint(sub)
    )


def plain_json(value: Any) -> bool:
    """Whether ``value`` holds only ``dict`` (``str`` keys), ``list`` and JSON scalars,
    in at most :data:`MAX_NODES` nodes."""
    stack = [value]
    nodes = 0
    while stack:
        v = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return False
        t = type(v)
        if t is dict:
            for k, c in v.items():
                if type(k) is not str:
                    return False
                stack.append(c)
        elif t is list:
            stack.extend(v)
        elif v is not None and t not in _SCALARS:
            return False
    return True


__all__ = ["MAX_NODES", "MAX_REMEMBERED", "Contract", "heavy_properties", "plain_json"]
