"""Markdown from models and JSON Schemas: the building blocks of the generated docs.

Pure functions (no I/O): :mod:`docgen.pages` assembles the pages.
Types are written in JSON terms (``string``, ``integer``, ``object``,
``array of string``, ``null``), with the schema's bounds beside them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel, SecretStr

DASH = "\u2013"  # an en dash: a range reads as one (1\u2013200)


def prose(text: str) -> str:
    """Docstring or description text as Markdown: RST double backticks become single,
    and ``<`` outside code spans is escaped so that ``<id>`` is not read as an HTML tag."""
    parts = text.replace("``", "`").split("`")
    # even pieces are outside code spans
    return "`".join(p.replace("<", "&lt;") if i % 2 == 0 else p for i, p in enumerate(parts))


def cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return prose(text).replace("|", "\\|").replace("\n", " ")


def code(value: Any) -> str:
    """A JSON value as inline code (compact JSON; strings quoted)."""
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; every cell is escaped."""
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def ref_name(ref: str) -> str:
    """The name a local ``$ref`` points at (``#/$defs/Budget`` -> ``Budget``)."""
    return ref.rsplit("/", 1)[-1]


def json_type(schema: Any, link_defs: bool = True) -> str:
    """A JSON Schema as a short type phrase: ``integer ≥ 1 ≤ 1000``, ``array of string``."""
    if schema is True or schema == {}:
        return "any JSON"
    if not isinstance(schema, dict):
        return "nothing" if schema is False else "any JSON"
    if "$ref" in schema:
        name = ref_name(schema["$ref"])
        return f"[{name}](#{name.lower()})" if link_defs else name
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = list(dict.fromkeys(json_type(s, link_defs) for s in schema[key]))
            nulls = [p for p in parts if p == "null"]
            return " or ".join([p for p in parts if p != "null"] + nulls)
    if "enum" in schema:
        return "one of " + ", ".join(code(v) for v in schema["enum"])
    if "const" in schema:
        return code(schema["const"])
    t = schema.get("type")
    if isinstance(t, list):
        base = " or ".join(t)
    elif t == "array":
        items = schema.get("items")
        base = "array" if items in (None, {}, True) else f"array of {_item(items, link_defs)}"
    elif t == "object":
        extra = schema.get("additionalProperties")
        patterns = schema.get("patternProperties") or {}
        base = "object"
        if isinstance(extra, dict) and extra:
            base = f"object of {_item(extra, link_defs)}"
        elif len(patterns) == 1:
            ((pattern, value),) = patterns.items()
            base = f"object of {_item(value, link_defs)} by name matching `{pattern}`"
    elif t is None:
        base = "any JSON"
    else:
        base = str(t)
    found = bounds(schema)
    return f"{base} ({', '.join(found)})" if found else base


def _item(schema: Any, link_defs: bool) -> str:
    phrase = json_type(schema, link_defs)
    return f"({phrase})" if " or " in phrase else phrase


def _range(lo: Any, hi: Any, unit: str) -> str | None:
    if lo is not None and hi is not None:
        return f"{lo}{DASH}{hi}{unit}"
    if lo is not None:
        return f"at least {lo}{unit}"
    if hi is not None:
        return f"at most {hi}{unit}"
    return None


def bounds(schema: dict[str, Any]) -> list[str]:
    """A schema's bounds in words: ``≥ 1``, ``non-empty``, ``at most 8 chars``, and
    ranges with an en dash (``1 to 64 chars`` written as a range)."""
    out = []
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if lo is not None and hi is not None:
        out.append(f"{lo}{DASH}{hi}")
    else:
        out += [f"≥ {lo}"] if lo is not None else []
        out += [f"> {schema['exclusiveMinimum']}"] if "exclusiveMinimum" in schema else []
        out += [f"≤ {hi}"] if hi is not None else []
        out += [f"< {schema['exclusiveMaximum']}"] if "exclusiveMaximum" in schema else []
    if "maxProperties" in schema:
        out.append(f"at most {schema['maxProperties']} entries")
    if schema.get("minLength") == 1 and "maxLength" not in schema:
        out.append("non-empty")
    elif (r := _range(schema.get("minLength"), schema.get("maxLength"), " chars")) is not None:
        out.append(r)
    if (r := _range(schema.get("minItems"), schema.get("maxItems"), " items")) is not None:
        out.append(r)
    if "format" in schema:
        out.append(f"format {schema['format']}")
    if "pattern" in schema:
        out.append(f"matching `{schema['pattern']}`")
    return out


def jsonable(value: Any) -> Any:
    """A Python default as the JSON a user writes."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, PurePath | Decimal):  # money is written as a decimal string
        return str(value)
    if isinstance(value, tuple | list):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def model_rows(model: type[BaseModel], notes: Mapping[str, str] | None = None) -> list[list[str]]:
    """One row per field: name (its alias), JSON type, default, meaning.

    ``notes`` gives the meaning of a field without a ``description``, by
    ``Model.field`` (models whose module the docs do not own).

    Raises:
        ValueError: a field without a ``description`` or a note: the docs would say nothing.
    """
    notes = notes or {}
    schema = model.model_json_schema(by_alias=True)
    props = schema.get("properties", {})
    rows = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        meaning = field.description or notes.get(f"{model.__name__}.{name}")
        if not meaning:
            raise ValueError(
                f"{model.__name__}.{name} has no description: add Field(description=...)"
            )
        if field.is_required():
            default = "required"
        else:
            default = code(jsonable(field.get_default(call_default_factory=True)))
        rows.append([f"`{key}`", json_type(props.get(key, {})), default, meaning])
    return rows


def model_section(model: type[BaseModel], notes: Mapping[str, str] | None = None) -> str:
    """A heading named after the model, its docstring's first paragraph and its field table."""
    doc = prose(" ".join((model.__doc__ or "").strip().split("\n\n")[0].split()))
    body = table(["field", "type", "default", "meaning"], model_rows(model, notes))
    return f"## {model.__name__}\n\n{doc}\n\n{body}\n"


def schema_rows(schema: dict[str, Any], meanings: dict[str, str] | None = None) -> list[list[str]]:
    """A worker's input or output schema, flattened: one row per property, nested
    ones as dotted paths (``extraction_spec.fields.<name>.selector``, ``warnings[].code``).

    A ``$defs`` entry is expanded once; a second use (a recursive schema) points
    back at the first path. ``meanings`` says what a property without a
    ``description`` means, by its path.

    Raises:
        ValueError: a path in ``meanings`` that the schema does not have.
    """
    meanings = meanings or {}
    defs = schema.get("$defs", {})
    rows: list[list[str]] = []
    seen: dict[str, str] = {}

    def resolve(s: Any, path: str) -> tuple[Any, str | None]:
        if isinstance(s, dict) and "$ref" in s:
            name = ref_name(s["$ref"])
            if name in seen:
                return None, seen[name]
            seen[name] = path
            return resolve(defs.get(name, {}), path)
        return s, None

    def walk(s: dict[str, Any], prefix: str) -> None:
        required = set(s.get("required", []))
        for key, sub in s.get("properties", {}).items():
            path = f"{prefix}{key}"
            add(sub, path, "yes" if key in required else "")

    def add(sub: Any, path: str, required: str) -> None:
        target, again = resolve(sub, path)
        if again is not None:
            rows.append([f"`{path}`", f"as `{again}`", required, "", ""])
            return
        if not isinstance(target, dict):
            rows.append([f"`{path}`", json_type(target, False), required, "", ""])
            return
        default = code(target["default"]) if "default" in target else ""
        options = target.get("anyOf") or target.get("oneOf") or []
        rows.append(
            [
                f"`{path}`",
                _phrase(target, defs),
                required,
                default,
                target.get("description") or meanings.get(path, ""),
            ]
        )
        for option in [target, *options]:
            opt, _ = resolve(option, path) if option is not target else (option, None)
            if not isinstance(opt, dict):
                continue
            walk(opt, path + ".")
            extra = opt.get("additionalProperties")
            # a map of plain values says all in its type; a map of records gets its rows
            if isinstance(extra, dict) and ({"$ref", "properties", "anyOf"} & set(extra)):
                add(extra, f"{path}.<name>", "")
            items = opt.get("items")
            if opt.get("type") == "array" and isinstance(items, dict) and items.get("properties"):
                walk(items, path + "[].")

    walk(schema, "")
    stale = set(meanings) - {row[0].strip("`") for row in rows}
    if stale:
        raise ValueError(f"no such field in the schema: {', '.join(sorted(stale))}")
    return rows


def _phrase(s: dict[str, Any], defs: dict[str, Any]) -> str:
    """``json_type`` with local references named after their definitions, unlinked."""
    options = s.get("anyOf") or s.get("oneOf")
    if options:
        return " or ".join(
            dict.fromkeys(
                _phrase(defs.get(ref_name(o["$ref"]), {}), defs)
                if "$ref" in o
                else json_type(o, False)
                for o in options
            )
        )
    if s.get("type") == "object" and isinstance(s.get("additionalProperties"), dict):
        extra = s["additionalProperties"]
        if "$ref" in extra:
            return f"object of {ref_name(extra['$ref'])} by name"
    return json_type(s, False)
