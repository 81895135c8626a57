"""Compiled JSON Schema validators, cached by schema content.

Compiling a validator costs far more than running it; pipelines validate the
same schemas over and over, so validators are cached by the canonical JSON
of their schema (bounded LRU).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from aiworker.schemas.spec import json_path

_FORMAT_CHECKER = Draft202012Validator.FORMAT_CHECKER


@functools.lru_cache(maxsize=512)
def _compiled(canonical: str) -> Draft202012Validator:
    schema = json.loads(canonical)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=_FORMAT_CHECKER)


def validator_for(schema: Any) -> Draft202012Validator:
    """A compiled 2020-12 validator with format checks; ``SchemaError`` if invalid."""
    return _compiled(json.dumps(schema, sort_keys=True, separators=(",", ":")))


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


__all__ = ["SchemaError", "describe", "json_path", "validator_for"]
