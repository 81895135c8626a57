"""Compiled JSON Schema validators, cached by schema content.

Compiling a validator costs far more than running it; pipelines validate the
same schemas over and over, so validators are cached by the canonical JSON
of their schema (bounded LRU). Every validator is built by
:mod:`aiworker.schemas.safe_schema`: no ``$ref`` retrieval, user patterns on
RE2, the 2020-12 format checks.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator

from aiworker.schemas import safe_schema
from aiworker.schemas.spec import json_path


@functools.lru_cache(maxsize=512)
def _compiled(canonical: str) -> Validator:
    return safe_schema.validator(json.loads(canonical))


def validator_for(schema: Any) -> Validator:
    """A compiled, checked validator (see ``safe_schema``); ``SchemaError`` if refused."""
    return _compiled(json.dumps(schema, sort_keys=True, separators=(",", ":")))


def errors_of(schema: Any, value: Any) -> list[ValidationError]:
    """Every error of ``value`` under ``schema``; ``SchemaError`` if the schema is
    refused or cannot be applied to this value."""
    return safe_schema.errors(validator_for(schema), value)


def describe(errors: list[ValidationError], limit: int = 100) -> list[dict[str, str]]:
    """Validation errors as machine-actionable reasons, most specific first."""
    reasons = []
    for e in sorted(errors, key=lambda e: (list(map(str, e.absolute_path)), e.validator))[:limit]:
        reasons.append(
            {
                "path": json_path(e.absolute_path),
                "message": e.message,
                "validator": str(e.validator),
                "schema_path": "/".join(str(p) for p in e.absolute_schema_path),
            }
        )
    return reasons


schema_problem = safe_schema.problem


__all__ = ["SchemaError", "describe", "errors_of", "json_path", "schema_problem", "validator_for"]
