"""A spec's contract, compiled once: jsonschema-rs in front, and a memo of valid parts.

**jsonschema-rs first.** A value is first put to jsonschema-rs (the maintained
Rust validator, :func:`rs_validator`), configured as safe_schema applies a
schema: Draft 2020-12, nothing retrieved, the same Python format checks, its
linear-time regex engine. When it says valid, the value is valid and no
Python validator runs; otherwise jsonschema checks it as before and words every
error (:mod:`aiworker.schemas.messages` reads jsonschema's error tree). That
order is exact only where the two agree, so jsonschema-rs stands aside:

- for a schema with a keyword whose meaning differs (:func:`rs_shares`): a
  ``pattern`` outside a plain subset (escapes, ``.``, ``{,n}``: RE2 against
  Rust's regex after an ECMA 262 translation), ``patternProperties``,
  ``multipleOf`` and the unevaluated keywords;
- for a value it reads otherwise than Python (:func:`surely_valid`): a tuple (an
  array there, not for jsonschema), NaN or an infinity (null there), an int past
  2**53, a non-string key, a string it cannot encode (a lone surrogate).

Measured (``python -m bench.schemas``, one full run on a quiet 2-core machine,
jsonschema-rs 0.60.3): web-scrape's output checked in 0.28 of jsonschema's time
(48 against 167 us, 43 of them the walk that looks for such values;
jsonschema-rs alone 4.7 us), the validator's input and output in 0.16 and
0.06; the runtime's own cost per validator call 0.81 of what it was with
jsonschema alone (199 against 245 us).
``tests/activities/test_contract_fast_path.py`` holds the two to the same answers
on every built-in contract and on generated patterns of the plain subset.

**The memo.** Validating an input is jsonschema walking the whole value on every
call, and in a ``for_each`` the big part of it is the same on every item: a web-scrape
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
own caching: it has none for instances. Measured (``python -m bench.schemas``,
``input_memo``: web-scrape's input with one extraction spec and a new url per
call, one run on a loaded 2-core machine): a memo hit costs 0.10 of jsonschema's
full check (401 against 4,158 us). jsonschema-rs would check the whole input in
0.005 of the memo hit's time (2.1 us), but web-scrape's ``url`` pattern has
``\\s``, which RE2 and Rust's regex read differently, so the memo serves it.
Bounded: :data:`MAX_REMEMBERED` digests per contract (least recently used go
first), values over :data:`MAX_NODES` nodes are never remembered.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jsonschema_rs
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
        self.fast: Any = rs_validator(schema)

    def errors(self, value: Any) -> list[ValidationError]:
        """Every error of ``value``, as ``safe_schema.errors(self.validator, value)``."""
        if self.fast is not None and surely_valid(self.fast, value):
            return []
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


def plain_json(value: Any, *, exact: bool = False) -> bool:
    """Whether ``value`` holds only ``dict`` (``str`` keys), ``list`` and JSON scalars,
    in at most :data:`MAX_NODES` nodes. ``exact``: and every float finite, every
    int within :data:`MAX_EXACT_INT` either way (what jsonschema-rs reads as Python
    does, :func:`surely_valid`)."""
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
        elif exact and t is float and not math.isfinite(v):
            return False
        elif exact and t is int and not -MAX_EXACT_INT <= v <= MAX_EXACT_INT:
            return False
    return True


# --- jsonschema-rs: the "surely valid" check in front of jsonschema ----------------------------

# Schema keywords whose meaning jsonschema-rs does not share with safe_schema:
# patternProperties (its keys are patterns), multipleOf (float arithmetic of its own)
# and the unevaluated keywords (safe_schema collects the evaluated keys itself). A
# schema that has any of these as a key anywhere (a property named so too: erring on
# the safe side) is checked by jsonschema alone.
RS_UNSHARED = frozenset(
    {"patternProperties", "multipleOf", "unevaluatedProperties", "unevaluatedItems"}
)
# A ``pattern`` that means the same on RE2 (safe_schema) and on Rust's regex after
# jsonschema-rs's ECMA 262 translation: ASCII letters, digits and the plain operators,
# no escapes (``\d`` and ``\s`` differ in Unicode), no ``.`` (which line terminators
# each refuses differ), no empty class (``[]`` matches nothing in ECMA 262) and braces
# only as counted repetition (``{2}``, ``{0,63}``, ``{2,}``: ``{,3}`` is a repetition
# in Rust and text in the others). Any other pattern: jsonschema alone.
_SHARED_PATTERN = re.compile(r"[A-Za-z0-9^$*+?\[\],|()_:/-]*")
_REPEAT = re.compile(r"\{[0-9]+(,[0-9]*)?\}")
# Ints past 2**53 either way go to jsonschema: exact there, floats in some paths of Rust.
MAX_EXACT_INT = 2**53


def _shared_pattern(pattern: Any) -> bool:
    if not isinstance(pattern, str) or "[]" in pattern or "[^]" in pattern:
        return False
    return _SHARED_PATTERN.fullmatch(_REPEAT.sub("", pattern)) is not None


def rs_shares(schema: Any) -> bool:
    """Whether every keyword of ``schema`` means on jsonschema-rs what it means on
    safe_schema: no key of :data:`RS_UNSHARED` anywhere and every ``pattern`` key a
    string of the shared subset (a property named ``pattern`` fails that too)."""
    stack = [schema]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, c in v.items():
                if k in RS_UNSHARED:
                    return False
                if k == "pattern" and not _shared_pattern(c):
                    return False
                stack.append(c)
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _format(check: tuple[Callable[[Any], Any], Any]) -> Callable[[str], bool]:
    func, raises = check

    def conforms(value: str) -> bool:
        try:
            return bool(func(value))
        except raises:
            return False

    return conforms


def _refuse(uri: str) -> Any:
    raise ValueError(f"$ref {uri!r} {safe_schema.NOT_FETCHED}")


@functools.lru_cache(maxsize=1)
def _formats() -> dict[str, Callable[[str], bool]]:
    return {name: _format(c) for name, c in safe_schema.FORMATS.checkers.items()}


def rs_validator(schema: Any, *, shared_only: bool = True) -> Any:
    """jsonschema-rs's Draft 2020-12 validator of ``schema`` with safe_schema's
    formats (the same Python checks), no retrieval and its linear-time regex
    engine; None where its answers could differ from safe_schema's (not
    :func:`rs_shares`; ``shared_only=False``, for benches only, compiles it all
    the same), or for a schema it does not compile."""
    if not isinstance(schema, (dict, bool)) or (shared_only and not rs_shares(schema)):
        return None
    try:
        return jsonschema_rs.Draft202012Validator(
            schema,
            retriever=_refuse,
            pattern_options=jsonschema_rs.RegexOptions(),
            formats=_formats(),
            validate_formats=True,
        )
    except Exception:  # not compiled there: jsonschema alone decides
        return None


def surely_valid(fast: Any, value: Any) -> bool:
    """Whether jsonschema-rs (``fast``, from :func:`rs_validator`) finds ``value``
    valid, for a value it reads as Python does (:func:`plain_json` with ``exact``:
    no tuple, no NaN, no non-string key, no int past 2**53). False says nothing:
    jsonschema then checks and words the errors."""
    if not plain_json(value, exact=True):
        return False
    try:
        return bool(fast.is_valid(value))
    except Exception:  # a lone surrogate, say: jsonschema decides
        return False


__all__ = [
    "MAX_EXACT_INT",
    "MAX_NODES",
    "MAX_REMEMBERED",
    "RS_UNSHARED",
    "Contract",
    "heavy_properties",
    "plain_json",
    "rs_shares",
    "rs_validator",
    "surely_valid",
]
