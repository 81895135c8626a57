"""The one JSON Schema validator aiworker builds: it fetches nothing and never backtracks.

Every schema the project applies goes through :func:`validator` (or
:func:`check` first): the validator worker, llm-call's ``response_schema``, the
worker runtime's input and output contracts, worker specs, a step's ``when``
and ``validate``, the review Update's checks, external workers' replies and the
conformance kit. What it adds to jsonschema's Draft 2020-12 validator:

- **No retrieval.** jsonschema's default registry fetches a ``$ref`` it does
  not hold with ``urllib`` (no egress policy, no timeout, ``file://`` too).
  Here the registry is an empty ``referencing.Registry()``, which retrieves
  nothing, and :func:`check` refuses any ``$ref``, ``$dynamicRef`` or ``$id``
  that does not start with ``#`` (a local reference), and any local reference
  that resolves to nothing, before a validator exists.
- **Linear-time patterns.** jsonschema's ``pattern``, ``patternProperties``,
  ``additionalProperties`` and ``unevaluatedProperties`` keywords call
  ``re.search`` (the last two for ``patternProperties`` names); they are
  replaced by versions that run every pattern on RE2 (:mod:`.patterns`), and
  :func:`check` compiles each pattern first, so one RE2 refuses is reported
  naming its place. jsonschema has no hook for the regex engine, hence the
  keyword functions here (after jsonschema 4.26's own).
- **Formats** as the validator worker checks them: jsonschema's 2020-12
  format checker with ``regex`` on RE2 and ``iri`` in linear time
  (:mod:`.formats`).
- **Bounded nesting**: a schema deeper than :data:`MAX_DEPTH` is refused
  before jsonschema recurses through it.

No I/O; the workflow sandbox passes this module through (``re2`` is a C
extension), so a ``when`` schema evaluated in a workflow task runs on RE2.

**Measured against jsonschema-rs** (``python -m bench.schemas``, issue #46:
jsonschema-rs 0.61.2 with its linear-time ``RegexOptions`` engine, a
retriever that refuses everything and :data:`FORMATS`' Python checks as its
formats; valid values, medians, one run on a loaded 2-core machine): per
check, jsonschema-rs took 0.0014 of this validator's time on web-scrape's
input (its recursive ``extraction_spec``: 3.2 against 2,215 us), 0.013 on
its output (a page of 30 items: 6.9 against 525 us) and 0.007 on the
validator worker's input (0.6 against 81 us); the runtime's own cost per
call (``bench/overhead.py``'s validator call) 0.75 (303 against 405 us).

It is that much faster and it is not the validator on its own, because it does not
keep what this module promises for values JSON allows: a string with a lone
surrogate (``"\\ud800b"``) raises ``UnicodeEncodeError`` instead of being
checked, NaN and infinities are read as ``null`` (not numbers), a tuple is an
array and a non-string key raises ``ValueError``; its ``pattern`` dialect
(ECMA 262 translated to Rust's ``regex``) is not RE2's, which extraction
``regex`` and ``format: regex`` keep; and every message of :mod:`.messages`
(the most relevant branch of an ``anyOf``, an unknown key with a close
match, every metaschema error at once) reads jsonschema's error tree.
Bridging those is a rewrite of this module and of :mod:`.messages`, not a
swap. What it does instead: a worker's contracts ask it first whether a value
is surely valid, where a schema and a value mean the same to both, and come
here for the errors (:mod:`aiworker.activities.contracts`).

The home-made "surely valid" pre-check that sat in front of jsonschema for
plain schemas (``fast_valid``) is gone. In one run against it (the commit
before its removal, same machine): jsonschema alone took 4.9 times its time
on web-scrape's output and on the validator's input, 7.7 times on the
validator's output; the runtime's cost per call became 1.27 times (444
against 350 us); jsonschema-rs took 0.07, 0.04 and 0.04 of it, and 0.95 per
runtime call.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from aiworker.schemas.caps import DEFAULT_MAX_JSON_DEPTH
from aiworker.schemas.formats import formats
from aiworker.schemas.messages import additional_keys, issues
from aiworker.schemas.patterns import PatternError, compile_pattern, search

# Nesting of a schema (objects and arrays) beyond which it is refused: jsonschema
# recurses a few frames per level, and Python's stack ends near 1000 frames. A
# schema is user JSON like any other: the same default as every JSON walk.
MAX_DEPTH = DEFAULT_MAX_JSON_DEPTH

NOT_FETCHED = "is not local; aiworker never fetches schemas"
_REF_KEYWORDS = ("$ref", "$dynamicRef")
# Keywords whose value is an object of name -> subschema (the names are data).
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
# Keywords whose value is data, never a schema: a "$ref" key inside is a value.
_DATA = frozenset({"const", "enum", "default", "examples", "required", "dependentRequired"})


# --- the keywords that meet user patterns ------------------------------------------------------


def _pattern(v: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if v.is_type(instance, "string") and search(compile_pattern(pattern), instance) is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    v: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not v.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = compile_pattern(pattern)
        for k, value in instance.items():
            if search(regex, k) is not None:
                yield from v.descend(value, subschema, path=k, schema_path=pattern)


def _additional_properties(
    v: Any, ap: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not v.is_type(instance, "object"):
        return
    extras = additional_keys(instance, schema)
    if v.is_type(ap, "object"):
        for extra in extras:
            yield from v.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        names = ", ".join(repr(e) for e in sorted(extras))
        if "patternProperties" in schema:
            patterns = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(f"{names} {verb} not match any of the regexes: {patterns}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({names} {verb} unexpected)"
            )


def _valid(errors: Iterator[ValidationError]) -> bool:
    return next(errors, None) is None


def _evaluated_keys(v: Any, instance: dict[str, Any], schema: Any) -> set[str]:
    """The keys of ``instance`` that ``schema`` evaluates (for unevaluatedProperties)."""
    if v.is_type(schema, "boolean"):
        return set()
    keys: set[str] = set()
    for ref_keyword in _REF_KEYWORDS:
        ref = schema.get(ref_keyword)
        if ref is not None:
            resolved = v._resolver.lookup(ref)
            evolved = v.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys |= _evaluated_keys(evolved, instance, resolved.contents)
    properties = schema.get("properties")
    if v.is_type(properties, "object"):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (sub := schema.get(keyword)) is not None:
            keys |= {k for k, value in instance.items() if _valid(v.descend(value, sub))}
    if "patternProperties" in schema:
        regexes = [compile_pattern(p) for p in schema["patternProperties"]]
        keys |= {k for k in instance if any(search(r, k) is not None for r in regexes)}
    for name, sub in schema.get("dependentSchemas", {}).items():
        if name in instance:
            keys |= _evaluated_keys(v, instance, sub)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(keyword, []):
            if _valid(v.descend(instance, sub)):
                keys |= _evaluated_keys(v, instance, sub)
    if "if" in schema:
        if v.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(v, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(v, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(v, instance, schema["else"])
    return keys


def _unevaluated_properties(
    v: Any, up: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not v.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(v, instance, schema)
    bad = [
        k
        for k in instance
        if k not in evaluated and not _valid(v.descend(instance[k], up, path=k, schema_path=k))
    ]
    if bad:
        names = ", ".join(repr(k) for k in sorted(bad, key=str))
        verb = "was" if len(bad) == 1 else "were"
        if up is False:
            yield ValidationError(
                f"Unevaluated properties are not allowed ({names} {verb} unexpected)"
            )
        else:
            yield ValidationError(
                "Unevaluated properties are not valid under the given schema "
                f"({names} {verb} unevaluated and invalid)"
            )


FORMATS = formats()
_Safe: Any = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "unevaluatedProperties": _unevaluated_properties,
    },
    format_checker=FORMATS,
)
_META = _Safe(Draft202012Validator.META_SCHEMA, registry=Registry(), format_checker=FORMATS)


# --- the check before a validator exists -------------------------------------------------------


def where(path: tuple[Any, ...] | Any) -> str:
    """A place inside a schema as a JSON Pointer (``/properties/a``), ``(root)`` for none."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "/" + "/".join(parts) if parts else "(root)"


class SchemaRefused(SchemaError, ValueError):
    """A schema that may be valid JSON Schema but that aiworker does not apply: a
    remote reference, a pattern RE2 refuses, a reference to nothing, too deep."""


def _refuse(message: str, path: tuple[Any, ...]) -> SchemaRefused:
    return SchemaRefused(message, path=path)


def problem(e: SchemaError) -> str:
    """What is wrong with a schema :func:`check` refused, and where, for a message
    that goes on to name the step and field."""
    if isinstance(e, SchemaRefused):
        at = f" at {where(e.absolute_path)}" if e.absolute_path else ""
        return f"{e.message}{at}"
    # The metaschema's error in JSON terms, at its most relevant place (a branch of
    # the metaschema's anyOf, say), which is a place in the user's schema.
    found = issues(e)[0]
    at = f" at {where(found.path)}" if found.path else ""
    return f"invalid JSON Schema{at}: {found.text}"


# A schema's problems are listed up to this many; the rest are counted.
MAX_PROBLEMS = 20


def problems(schema: Any) -> list[str]:
    """Every problem :func:`check` finds in ``schema``, each worded as :func:`problem`
    words one: all of the metaschema's errors at once (the most relevant first, as
    :func:`check` raises it), not only the first, up to :data:`MAX_PROBLEMS` (then a
    line counting the rest); empty when the schema is fine.

    A remote reference, a pattern RE2 refuses or a schema too deep is reported
    alone: the walk that finds it stops there, before the metaschema recurses.
    """
    try:
        local = _walk(schema)
    except SchemaError as e:
        return [problem(e)]
    found = list(_META.iter_errors(schema))
    if found:
        best = best_match(found)
        ordered = [best, *(e for e in found if e is not best)] if best is not None else found
        out = [problem(SchemaError.create_from(e)) for e in ordered[:MAX_PROBLEMS]]
        if len(ordered) > MAX_PROBLEMS:
            out.append(f"and {len(ordered) - MAX_PROBLEMS} more JSON Schema errors")
        return out
    if not local:
        return []
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    out = []
    for ref, path in local:
        try:
            resolver.lookup(ref)
        except Unresolvable:
            out.append(
                problem(_refuse(f"$ref {ref[:200]!r} resolves to nothing in this schema", path))
            )
    if len(out) > MAX_PROBLEMS:
        out[MAX_PROBLEMS:] = [f"and {len(out) - MAX_PROBLEMS} more JSON Schema errors"]
    return out


def described(schema: Any, e: SchemaError) -> str:
    """``schema``'s :func:`problems` on one line (``; `` between them), for a worker
    that refuses it when it runs; :func:`problem` of ``e`` when the check finds none
    (the schema failed only when applied)."""
    return "; ".join(problems(schema)) or problem(e)


def _walk(schema: Any, patterns: bool = True) -> list[tuple[str, tuple[Any, ...]]]:
    """Refuse remote references and (with ``patterns``) patterns RE2 will not run;
    the local references with their places. Iterative, so that depth is counted
    before anything recurses."""
    local: list[tuple[str, tuple[Any, ...]]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise _refuse(f"the schema is nested deeper than {MAX_DEPTH} levels", path)
        if isinstance(node, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for keyword in (*_REF_KEYWORDS, "$id"):
            value = node.get(keyword)
            if isinstance(value, str):
                if not value.startswith("#"):
                    raise _refuse(f"{keyword} {value[:200]!r} {NOT_FETCHED}", path)
                if keyword != "$id":
                    local.append((value, path))
        if patterns and isinstance(node.get("pattern"), str):
            _compile(node["pattern"], "pattern", (*path, "pattern"))
        for key, value in node.items():
            if key in _DATA:
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                for name, sub in value.items():
                    if patterns and key == "patternProperties":
                        _compile(name, "patternProperties name", (*path, key))
                    stack.append((sub, (*path, key, name)))
            elif isinstance(value, dict | list):
                stack.append((value, (*path, key)))
    return local


def _compile(pattern: str, what: str, path: tuple[Any, ...]) -> None:
    try:
        compile_pattern(pattern)
    except PatternError as e:
        raise _refuse(f"{what} {e}", path) from None


def check_references(schema: Any) -> None:
    """Only the part of :func:`check` that keeps schemas in the process: ``SchemaRefused``
    for a remote ``$ref``/``$dynamicRef``/``$id`` (or a schema too deep to walk).

    For a schema a worker checks in full when it runs (a validator step's
    ``input.schema``), so that the run is refused before anything starts.
    """
    _walk(schema, patterns=False)


def check(schema: Any) -> None:
    """Check ``schema`` as aiworker applies it.

    Raises:
        SchemaError: naming the place (``absolute_path``) and the problem: a remote
            ``$ref``/``$id``, a pattern RE2 refuses, a local reference to nothing, too
            deep, or not a valid Draft 2020-12 schema.
    """
    local = _walk(schema)
    error = best_match(_META.iter_errors(schema))
    if error is not None:
        raise SchemaError.create_from(error)
    if not local:
        return
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    for ref, path in local:
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise _refuse(f"$ref {ref[:200]!r} resolves to nothing in this schema", path) from None


def validator(schema: Any) -> Validator:
    """A checked Draft 2020-12 validator with format checks, RE2 patterns and no retrieval.

    Raises:
        SchemaError: as :func:`check`.
    """
    check(schema)
    v: Validator = _Safe(schema, registry=Registry(), format_checker=FORMATS)
    return v


@functools.lru_cache(maxsize=512)
def _compiled(canonical: str) -> Validator:
    return validator(json.loads(canonical))


def cached_validator(schema: Any) -> Validator:
    """:func:`validator`, cached by the schema's canonical JSON: compiling a validator
    costs far more than running it, and pipelines apply the same schemas over and over."""
    return _compiled(json.dumps(schema, sort_keys=True, separators=(",", ":")))


@contextlib.contextmanager
def _applying() -> Iterator[None]:
    try:
        yield
    except (Unresolvable, PatternError) as e:
        raise SchemaRefused(f"the schema cannot be applied: {e}") from None
    except RecursionError:
        raise SchemaRefused(
            "the schema cannot be applied: it refers to itself without end, "
            "or the value is nested too deeply for it"
        ) from None


def errors(v: Validator, value: Any) -> list[ValidationError]:
    """Every error of ``value`` under ``v``; ``SchemaError`` when the schema cannot be
    applied to it after all (a reference loop as deep as the value, say)."""
    with _applying():
        return list(v.iter_errors(value))


def first_error(v: Validator, value: Any) -> ValidationError | None:
    """The first error of ``value`` under ``v``, None when it is valid; ``SchemaRefused``
    (a ``ValueError`` too) as :func:`errors`."""
    with _applying():
        return next(iter(v.iter_errors(value)), None)


def is_valid(schema: Any, value: Any) -> bool:
    """Whether ``value`` matches ``schema`` (checked first); ``SchemaError`` as :func:`check`."""
    return first_error(validator(schema), value) is None


__all__ = [
    "FORMATS",
    "MAX_DEPTH",
    "NOT_FETCHED",
    "PatternError",
    "SchemaError",
    "SchemaRefused",
    "ValidationError",
    "additional_keys",
    "cached_validator",
    "check",
    "check_references",
    "described",
    "errors",
    "first_error",
    "is_valid",
    "problem",
    "problems",
    "validator",
    "where",
]
