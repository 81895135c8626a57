"""Compiled JSON Schema validators, cached by schema content.

Compiling a validator costs far more than running it; pipelines validate the
same schemas over and over, so validators are cached by the canonical JSON
of their schema (bounded LRU). Every validator is built by
:mod:`aiworker.schemas.safe_schema`: no ``$ref`` retrieval, user patterns on
RE2, the 2020-12 format checks.
"""

from __future__ import annotations

from typing import Any

from jsonschema.exceptions import SchemaError, ValidationError

from aiworker.schemas import messages, safe_schema
from aiworker.schemas.messages import json_path

# The cache lives beside the validator, so the pipeline check shares it.
validator_for = safe_schema.cached_validator


def errors_of(schema: Any, value: Any) -> list[ValidationError]:
    """Every error of ``value`` under ``schema``; ``SchemaError`` if the schema is
    refused or cannot be applied to this value."""
    return safe_schema.errors(validator_for(schema), value)


# Validation errors as reasons in JSON terms (one formatter for every message).
describe = messages.reasons


schema_problem = safe_schema.problem


__all__ = ["SchemaError", "describe", "errors_of", "json_path", "schema_problem", "validator_for"]
