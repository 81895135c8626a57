"""The ``validator`` worker: JSON Schema validation with actionable reasons.

Returns ``{valid, errors: [{path, message, validator, schema_path}]}``. Used
as a gate (``gate: true`` in its input, which pipelines set for gate steps),
invalid data fails with ``validation_failed`` carrying the same reasons, so a
workflow can route on the code and feed the reasons back to the producer.
"""

from __future__ import annotations

from typing import Any

from jsonschema.exceptions import SchemaError

from aiworker.activities.errors import InvalidInputError, ValidationFailedError
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.config.catalog import builtin_spec
from aiworker.schemas import messages, safe_schema


class Validator(Worker):
    """Validates ``data`` against ``schema`` (JSON Schema 2020-12 with formats)."""

    spec = builtin_spec("validator")

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        schema = input["schema"]
        limit = int(input.get("max_errors", 100))
        try:
            errors = safe_schema.errors(safe_schema.cached_validator(schema), input["data"])
        except SchemaError as e:
            raise InvalidInputError(
                f"input.schema: {safe_schema.described(schema, e)}", field="input.schema"
            ) from None
        reasons = messages.reasons(errors, limit)
        if errors and input.get("gate", False):
            raise ValidationFailedError(
                f"{len(errors)} validation error(s); first: {reasons[0]['path']}: "
                f"{reasons[0]['message']}",
                reasons=reasons,
            )
        outputs: dict[str, Any] = {"valid": not errors, "errors": reasons}
        if len(errors) > limit:
            outputs["truncated"] = True
        return WorkerResult(outputs=outputs, log_fields={"valid": not errors})
