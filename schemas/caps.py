"""Caps on what one pipeline may ask of the engine: fan-out, steps, nesting,
reference strings and the size of what references resolve to.

Every user-controlled structure the engine walks is bounded here, so that bad
input ends as a stable code (``invalid_input`` for a structural cap,
``payload_too_large`` for a resolved size) instead of a stalled or crashed
workflow task.

Two layers, because the workflow cannot read settings:

- **Hard ceilings** (the ``HARD_*`` constants): fixed, never configurable. The
  spec check at workflow start runs before anything tells the workflow the
  process's settings, inside the workflow task itself; it checks against
  these ceilings only, which keep that check linear and its walks shallow
  (the ``${{`` scan is one pass, nesting is checked before anything recurses).
- **Caps** (:class:`Caps`, defaults the ``DEFAULT_*`` constants): set by the
  operator (``AIWORKER_MAX_*``, each bounded by its ceiling) and applied where
  settings are known: on the client side (``aiworker check``/``run``,
  ``PipelineClient.start``) before anything starts, and in the workflow right
  after the ``run-config`` local activity, which carries them
  (``RunConfig.caps``, recorded in history) before any step runs. Activities read
  them from their settings (JSON-LD nesting in the extractor).

The defaults leave room for real work: a ``for_each`` of 100,000 small items,
a JSON Schema nested a few dozen levels, a prompt template of a few KiB.
"""

from __future__ import annotations

from pydantic import Field

from aiworker.schemas.base import Model

# -- hard ceilings: the parse-time check inside the workflow task ------------

HARD_MAX_STEPS = 200
"""Steps in one pipeline (the spec model refuses more)."""
HARD_MAX_FOREACH_ITEMS = 1_000_000
"""Items of one ``for_each``."""
HARD_MAX_JSON_DEPTH = 128
"""Nesting of any JSON value in a spec or resolved from it: containers inside
containers. Under the data converter's own limits (about 200 levels decoded),
so whatever the engine accepts can also cross Temporal."""
HARD_MAX_REFERENCE_CHARS = 1024 * 1024
"""Characters of one string that holds ``${{ }}`` references."""
MAX_REFERENCES_PER_STRING = 100
"""``${{ }}`` references in one string (fixed: a longer template is split)."""
HARD_MAX_REFERENCES = 10_000
"""``${{ }}`` references in one pipeline."""
HARD_MAX_RESOLVED_BYTES = 64 * 1024 * 1024
"""Size of one resolved value (see :data:`DEFAULT_MAX_RESOLVED_BYTES`)."""
HARD_MAX_FOREACH_BYTES = 256 * 1024 * 1024
"""Size of a ``for_each`` step's list and item inputs together."""

# -- what a pipeline asks the checks to compile (fixed, never configurable) ----
#
# Checking a JSON Schema against the metaschema costs about 0.2 ms per
# subschema, and compiling an RE2 pattern up to its memory limit (see
# :mod:`~aiworker.schemas.patterns`) a few ms: a pipeline with thousands of them
# held an event loop or a workflow task for seconds. These are counted before
# anything compiles (one pass over the literal schemas and patterns, distinct
# ones only: the same schema or pattern compiles once), so that every check
# (``aiworker check``, ``run``, the client, ``serve``, the workflow) costs
# bounded time. Where they are counted: ``when.schema``, ``validate.schema``,
# the literal ``schema`` of a validator step and ``response_schema`` of an
# llm-call step (input and fallback_input), a web-scrape step's extraction
# ``regex`` fields and ``discover.pattern``.

MAX_PIPELINE_SCHEMAS = 100
"""Distinct literal JSON Schemas in one pipeline."""
MAX_PIPELINE_SCHEMA_NODES = 10_000
"""JSON values (objects, arrays, scalars) in a pipeline's distinct literal schemas
together; a ``const``, ``enum``, ``default`` or ``examples`` value counts as one."""
MAX_PIPELINE_PATTERNS = 256
"""Distinct regular expressions in one pipeline (``pattern``, ``patternProperties``
names, extraction ``regex``, ``discover.pattern``)."""
MAX_PIPELINE_PATTERN_CHARS = 32 * 1024
"""Characters of a pipeline's distinct patterns together."""
MAX_WORKFLOW_SCHEMA_NODES = 2_000
"""JSON values in the distinct ``when`` and ``validate`` schemas: the workflow applies
these itself (a ``when``, a review's check), inside a workflow task, which the
SDK's deadlock detector ends after 2 s."""
MAX_WORKFLOW_PATTERNS = 16
"""Distinct patterns in the ``when`` and ``validate`` schemas (as above)."""

# -- configurable defaults ----------------------------------------------------

DEFAULT_MAX_FOREACH_ITEMS = 100_000
"""Items of one ``for_each`` (``AIWORKER_MAX_FOREACH_ITEMS``)."""
DEFAULT_MAX_STEPS = HARD_MAX_STEPS
"""Steps in one pipeline (``AIWORKER_MAX_STEPS``; may only be lowered)."""
DEFAULT_MAX_JSON_DEPTH = 64
"""Nesting of pipeline inputs, step inputs, resolved values and JSON-LD
(``AIWORKER_MAX_JSON_DEPTH``)."""
DEFAULT_MAX_REFERENCE_CHARS = 64 * 1024
"""Characters of one string holding references (``AIWORKER_MAX_REFERENCE_CHARS``)."""
DEFAULT_MAX_REFERENCES = 1_000
"""References in one pipeline (``AIWORKER_MAX_REFERENCES``)."""
DEFAULT_MAX_RESOLVED_BYTES = 16 * 1024 * 1024
"""Compact-JSON size of one resolved value: a step's whole input, one
``for_each`` item's input, a ``when`` value, one pipeline output
(``AIWORKER_MAX_RESOLVED_BYTES``). Counted while resolving: an oversized value
is never built. Above a full page (the fetch tool's 5 MiB), which a step may
hand to the next through external payload storage."""
DEFAULT_MAX_FOREACH_BYTES = 64 * 1024 * 1024
"""Compact-JSON size of a ``for_each`` step's resolved list and all its item
inputs together (``AIWORKER_MAX_FOREACH_BYTES``)."""

DEFAULT_FOREACH_INLINE_ITEMS = 1_000
"""Items of a ``for_each`` whose outputs the pipeline keeps inline; above it they
go to the artifact store and ``outputs.items`` is a reference
(``AIWORKER_FOREACH_INLINE_ITEMS``; not a cap: nothing is refused)."""


class Caps(Model):
    """The configurable caps; each field is bounded by its hard ceiling."""

    max_foreach_items: int = Field(
        default=DEFAULT_MAX_FOREACH_ITEMS, ge=1, le=HARD_MAX_FOREACH_ITEMS
    )
    max_steps: int = Field(default=DEFAULT_MAX_STEPS, ge=1, le=HARD_MAX_STEPS)
    max_json_depth: int = Field(default=DEFAULT_MAX_JSON_DEPTH, ge=4, le=HARD_MAX_JSON_DEPTH)
    max_reference_chars: int = Field(
        default=DEFAULT_MAX_REFERENCE_CHARS, ge=256, le=HARD_MAX_REFERENCE_CHARS
    )
    max_references: int = Field(default=DEFAULT_MAX_REFERENCES, ge=1, le=HARD_MAX_REFERENCES)
    max_resolved_bytes: int = Field(
        default=DEFAULT_MAX_RESOLVED_BYTES, ge=1024, le=HARD_MAX_RESOLVED_BYTES
    )
    max_foreach_bytes: int = Field(
        default=DEFAULT_MAX_FOREACH_BYTES, ge=1024, le=HARD_MAX_FOREACH_BYTES
    )

    @classmethod
    def ceilings(cls) -> Caps:
        """The hard ceilings as caps: what the parse-time check enforces."""
        return cls(
            max_foreach_items=HARD_MAX_FOREACH_ITEMS,
            max_steps=HARD_MAX_STEPS,
            max_json_depth=HARD_MAX_JSON_DEPTH,
            max_reference_chars=HARD_MAX_REFERENCE_CHARS,
            max_references=HARD_MAX_REFERENCES,
            max_resolved_bytes=HARD_MAX_RESOLVED_BYTES,
            max_foreach_bytes=HARD_MAX_FOREACH_BYTES,
        )


# The settings that set each cap, for messages that tell an operator what to change.
SETTING_OF = {
    "max_foreach_items": "AIWORKER_MAX_FOREACH_ITEMS",
    "max_steps": "AIWORKER_MAX_STEPS",
    "max_json_depth": "AIWORKER_MAX_JSON_DEPTH",
    "max_reference_chars": "AIWORKER_MAX_REFERENCE_CHARS",
    "max_references": "AIWORKER_MAX_REFERENCES",
    "max_resolved_bytes": "AIWORKER_MAX_RESOLVED_BYTES",
    "max_foreach_bytes": "AIWORKER_MAX_FOREACH_BYTES",
}
