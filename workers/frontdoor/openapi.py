"""The front door's OpenAPI document, made to say what the server answers.

FastAPI writes the document from the routes; three things in it were not what
the server does, and a tester reading the document (schemathesis, a generated
client) met each one. :func:`conforming` rewrites them once, when the document
is first asked for:

- FastAPI adds a ``422`` with its own ``HTTPValidationError`` body to every
  route with parameters; the door answers a bad parameter ``400`` with
  ``{"error": {"code", "message"}}`` (:mod:`~aiworker.workers.frontdoor.http`).
  The added ones go (a route that does answer 422 declares it), and every
  refusal (4xx, 5xx) carries the :data:`ERROR_SCHEMA` body.
- A body schema written inline (``Model.model_json_schema()``) keeps its
  nested models under its own ``$defs``, which a reference such as
  ``#/$defs/CallbackError_`` cannot reach from inside the document: they move
  to ``components/schemas`` and the references follow.
- ``Error`` is added once to ``components/schemas``.
"""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "description": "a stable error code"},
                "message": {"type": "string"},
            },
        }
    },
}
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_FASTAPI_422 = "Validation Error"
_DEFS_PREFIX = "#/$defs/"
_COMPONENTS_PREFIX = "#/components/schemas/"


def conforming(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (FastAPI's document of the app) with its refusals, references and
    schemas as the server answers them (see the module docstring)."""
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            auto = responses.get("422")
            if auto is not None and auto.get("description") == _FASTAPI_422:
                del responses["422"]
            for status, response in responses.items():
                if status[:1] in ("4", "5") and "content" not in response:
                    response["content"] = {"application/json": {"schema": dict(_ERROR_REF)}}
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    _hoist_defs(doc.get("paths", {}), components)
    for schema in list(components.values()):
        _hoist_defs(schema, components)
    components["Error"] = ERROR_SCHEMA
    return doc


def _hoist_defs(node: Any, components: dict[str, Any]) -> None:
    """Move every nested ``$defs`` into ``components`` and point ``#/$defs/X`` there."""
    if isinstance(node, dict):
        defs = node.pop("$defs", None)
        if isinstance(defs, dict):
            for name, schema in defs.items():
                _hoist_defs(schema, components)
                components.setdefault(name, schema)
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX):
            node["$ref"] = _COMPONENTS_PREFIX + ref[len(_DEFS_PREFIX) :]
        for value in node.values():
            _hoist_defs(value, components)
    elif isinstance(node, list):
        for value in node:
            _hoist_defs(value, components)


__all__ = ["ERROR_SCHEMA", "conforming"]
