"""Worker specs: the published contract of each AI worker.

The models of a spec file (JSON Schema 2020-12 for ``input_schema`` and
``output_schema``), checked as a whole: a spec that could only fail at run
time is refused when it is read. :meth:`WorkerSpec.from_file` reads one file;
``aiworker.config.catalog`` reads the built-ins' folder and spec directories.
Long on purpose (about 480 lines): the model and the checks that refuse
a spec when it is read stay together (``execution``'s in ``schemas/execution.py``).

``implementation.kind`` says who runs a worker:

- ``python``: a :class:`aiworker.Worker` subclass in this or a plugin package;
- ``prompt``: no code; a system/user template run by the llm-call machinery,
  its ``output_schema`` the structured-output schema;
- ``external``: another process, in any language, polls ``task_queue`` and
  answers ``worker_id`` with the protocol's envelope; aiworker only calls it;
- ``workflow``: a built-in whose step runs as a child workflow, not an
  activity (``llm-agent``: each model turn and tool call an activity of its own).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from jsonschema.exceptions import SchemaError
from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from aiworker.schemas import safe_schema
from aiworker.schemas.base import Model
from aiworker.schemas.execution import EXECUTION_FIELD, Execution, check_execution
from aiworker.schemas.messages import json_path
from aiworker.schemas.refs import TEMPLATE_ROOTS, ReferenceError_, find_refs

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PERIOD_SECONDS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
}


# A contract version: printable ASCII without spaces (``1``, ``1.2.0``, ``2.0-rc1``),
# so that every reader compares and prints it the same way.
VERSION_PATTERN = r"^[!-~]{1,64}$"
_VERSION = re.compile(VERSION_PATTERN)


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key of a contract version: its ``.``/``-`` pieces, ASCII-digit pieces as
    numbers above every other piece (``1.10`` > ``1.9`` > ``1.rc``).

    ASCII digits only: ``str.isdigit`` is true of ``²`` and other scripts' digits,
    which ``int`` refuses or reads as another number; this never raises.
    """
    return tuple(
        (1, int(piece)) if piece.isascii() and piece.isdigit() else (0, piece)
        for piece in version.replace("-", ".").split(".")
    )


def parse_rate(text: str) -> tuple[int, float]:
    """Parse ``"10/min"`` into ``(10, 60.0)`` (``"5/20s"`` into ``(5, 20.0)``)."""
    m = _RATE.match(text)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"rate {text!r} is not of the form N/s, N/min, N/hour or N/<k>s")
    scale = float(m.group(2)) if m.group(2) else 1.0
    if scale <= 0:
        raise ValueError(f"rate {text!r} has an empty period")
    return int(m.group(1)), scale * _PERIOD_SECONDS[m.group(3)]


class SpecConstraints(Model):
    """The limits a worker runs under; requests may only tighten them."""

    timeout_seconds: float = Field(gt=0, le=86400)
    max_tokens: int | None = Field(default=None, ge=0)
    tools_allowed: list[str] = Field(default_factory=list)
    max_external_calls: int | None = Field(default=None, ge=0)
    rate_limit: str | None = Field(default=None, description='per tenant, e.g. "10/min"')

    @field_validator("rate_limit")
    @classmethod
    def _rate(cls, v: str | None) -> str | None:
        if v is not None:
            parse_rate(v)
        return v


class RetrySpec(Model):
    """How Temporal retries the worker's retryable failures."""

    max_attempts: int = Field(ge=1, le=100)
    backoff: Literal["exponential", "fixed"] = "exponential"
    initial_interval_ms: int = Field(default=1000, ge=1)
    max_interval_ms: int = Field(default=60000, ge=1)

    @model_validator(mode="after")
    def _intervals(self) -> RetrySpec:
        if self.max_interval_ms < self.initial_interval_ms:
            raise ValueError("max_interval_ms must be >= initial_interval_ms")
        return self


class ObservabilitySpec(Model):
    """Which input fields a worker's log line carries."""

    log_fields: list[str] = Field(default_factory=list)


class PythonImplementation(Model):
    """A worker class on the public SDK (built-ins and plugins)."""

    kind: Literal["python"] = "python"


# A template is a prompt, not a document: bounded like every user-written input.
_TEMPLATE_MAX_CHARS = 100_000


class FewShotExample(Model):
    """One worked example a prompt worker shows the model before the real input."""

    input: dict[str, Any]
    output: Any


class PromptImplementation(Model):
    """A worker with no code: templates run by the llm-call machinery.

    ``system`` and ``prompt`` are templates. ``${{ input.<path> }}`` is
    replaced by that part of the worker's input: a string as it is, any other
    value as compact JSON; a top-level field the input leaves out takes its
    ``default`` from ``input_schema``, and a value still missing renders as
    empty text; ``${{ input }}`` is the whole input as JSON.
    ``$${{`` is a literal ``${{``, and text that comes from the input is never
    expanded again. Every referenced top-level field must be declared in
    ``input_schema.properties``. Each ``few_shot`` example becomes a user turn
    (``prompt`` rendered with its ``input``) and an assistant turn (its
    ``output`` as JSON) before the real input. The spec's ``output_schema``
    is the structured-output schema the reply must match.
    """

    kind: Literal["prompt"]
    model: str = Field(
        default="default",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="a model alias of the model registry (AIWORKER_MODELS_FILE, or default)",
    )
    system: str | None = Field(default=None, max_length=_TEMPLATE_MAX_CHARS)
    prompt: str = Field(min_length=1, max_length=_TEMPLATE_MAX_CHARS)
    few_shot: list[FewShotExample] = Field(default_factory=list, max_length=50)
    temperature: float | None = Field(default=None, ge=0, le=2)


# The input field through which the validation loop hands a prompt worker the
# reasons its last reply was rejected (as llm-call's `feedback`). Every prompt
# worker's input_schema gets it, so no spec has to remember it; a spec may
# not give it another shape, because the loop always sends a list. As many
# items as the validator may return (its max_errors); the worker shows the
# model the first ones only.
FEEDBACK_FIELD = "feedback"
FEEDBACK_SCHEMA: dict[str, Any] = {
    "type": "array",
    "maxItems": 1000,
    "items": {"type": ["object", "string"]},
    "description": "validator reasons from an earlier attempt, shown to the model",
}


class ExternalImplementation(Model):
    """Another process polls the spec's task queue and answers with the envelope."""

    kind: Literal["external"]


class WorkflowImplementation(Model):
    """A built-in whose step runs as a child workflow (``llm-agent``); only aiworker's
    own specs have it: a plugin cannot add a workflow to the pipeline queue."""

    kind: Literal["workflow"]


_KINDS = ("python", "prompt", "external", "workflow")

Implementation = Annotated[
    PythonImplementation | PromptImplementation | ExternalImplementation | WorkflowImplementation,
    Field(discriminator="kind"),
]


class SpecExample(Model):
    """An input the conformance kit runs through the live worker.

    Examples that reach the network (or a model) are marked ``network``; they,
    and every example of a worker with ``side_effects``, run only when asked.
    """

    input: dict[str, Any]
    description: str | None = None
    network: bool = False


class WorkerSpec(Model):
    """The contract of one AI worker."""

    worker_id: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    version: str = Field(json_schema_extra={"pattern": VERSION_PATTERN})
    purpose: str
    task_queue: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    constraints: SpecConstraints
    retries: RetrySpec
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    heartbeat_seconds: float | None = Field(
        default=None, gt=0, description="heartbeat timeout for long work; None for short workers"
    )
    implementation: Implementation = Field(default_factory=PythonImplementation)
    side_effects: bool = Field(
        default=False,
        description="the worker changes the world (publish): examples run only when asked",
    )
    examples: list[SpecExample] = Field(default_factory=list, max_length=100)
    execution: Execution = EXECUTION_FIELD
    _checked: bool = PrivateAttr(default=False)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not _VERSION.fullmatch(v):
            raise ValueError(
                "a contract version is 1 to 64 printable ASCII characters without spaces "
                "(1, 1.2.0, 2.0-rc1)"
            )
        return v

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if _is_recorded(info):
            return v
        try:
            safe_schema.check(v)
        except safe_schema.SchemaRefused as e:
            raise ValueError(safe_schema.problem(e)) from None
        except SchemaError as e:
            raise ValueError(f"not a valid JSON Schema 2020-12: {e.message}") from None
        return v

    @model_validator(mode="before")
    @classmethod
    def _prompt_feedback(cls, raw: Any) -> Any:
        # The validation loop sends its reasons as `feedback`: every prompt
        # worker's input accepts it, whatever its own schema says. A spec that
        # declares `feedback` itself keeps its declaration (_check_prompt
        # refuses one of another shape).
        if not isinstance(raw, dict):
            return raw
        impl, schema = raw.get("implementation"), raw.get("input_schema")
        if not (isinstance(impl, dict) and impl.get("kind") == "prompt"):
            return raw
        if not isinstance(schema, dict):
            return raw
        props = schema.get("properties", {})
        if isinstance(props, dict) and FEEDBACK_FIELD not in props:
            props = {**props, FEEDBACK_FIELD: FEEDBACK_SCHEMA}
            raw = {**raw, "input_schema": {**schema, "properties": props}}
        return raw

    @model_validator(mode="after")
    def _examples_and_prompt(self, info: ValidationInfo) -> WorkerSpec:
        # pydantic runs an "after" validator again on an instance passed into
        # another model's field: a spec checked once (or recorded) is not again
        if self._checked or _is_recorded(info):
            self._checked = True
            return self
        inputs = safe_schema.validator(self.input_schema)
        for i, ex in enumerate(self.examples):
            err = safe_schema.first_error(inputs, ex.input)
            if err is not None:
                raise ValueError(f"examples[{i}].input{_path(err)}: {err.message}")
        impl = self.implementation
        if isinstance(impl, PromptImplementation):
            _check_prompt(self, impl)
        check_execution(self)
        self._checked = True
        return self

    @property
    def kind(self) -> str:
        """``python``, ``prompt``, ``external`` or ``workflow``."""
        return self.implementation.kind

    @classmethod
    def from_file(cls, path: str | Path) -> WorkerSpec:
        """Read and check one spec file; ``ValueError`` names the file and field."""
        p = Path(path)
        raw = read_json_file(p, "worker spec ")
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            raise ValueError(f"worker spec {p}: {describe_validation(e)}") from None


# The validation context of a spec read back from a run's history (a recorded
# run config, a chunk's or an agent's input): it was checked in full by the process
# that recorded it, so decoding it again skips the schema and example checks,
# which cost milliseconds per spec in every workflow task that decodes one.
RECORDED_CONTEXT: dict[str, Any] = {"aiworker_recorded_spec": True}


def _is_recorded(info: ValidationInfo) -> bool:
    ctx = info.context
    return isinstance(ctx, dict) and bool(ctx.get("aiworker_recorded_spec"))


def _decode_recorded(value: Any) -> Any:
    if isinstance(value, dict):
        return WorkerSpec.model_validate(value, context=RECORDED_CONTEXT)
    return value


RecordedSpec = Annotated[WorkerSpec, BeforeValidator(_decode_recorded)]
"""A :class:`WorkerSpec` as a run recorded it (see :data:`RECORDED_CONTEXT`): the
type of every payload field that carries specs into a workflow."""


def recorded(spec: WorkerSpec) -> WorkerSpec:
    """What a run records of ``spec``: all of it but its ``examples``, which only
    ``aiworker conformance`` reads and which would only make the history larger."""
    return spec.model_copy(update={"examples": []}) if spec.examples else spec


def read_json_file(path: Path, what: str = "") -> Any:
    """The JSON in ``path``; ``ValueError`` says ``<what><path>: why`` when it cannot be read."""
    try:
        return json.loads(path.read_text("utf-8"))
    except OSError as e:
        raise ValueError(f"{what}{path}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"{what}{path}: not valid JSON: {e}") from None


def _path(err: Any) -> str:
    # a suffix for a field name: `examples[0].input` + `.items[0]`
    return json_path(err.absolute_path)[1:]


def describe_validation(e: ValidationError) -> str:
    """A pydantic error as ``field.path: message`` lines joined by ``; ``."""
    parts = []
    for err in e.errors():
        path = list(err["loc"])
        # pydantic puts a tagged union's tag in the path: `implementation.prompt.model`
        # is the spec's `implementation.model` (and `prompt` a field of its own).
        if len(path) > 1 and path[0] == "implementation" and path[1] in _KINDS:
            del path[1]
        loc = ".".join(str(x) for x in path) or "(root)"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(msg if loc == "(root)" else f"{loc}: {msg}")
    return "; ".join(parts)


def _check_prompt(spec: WorkerSpec, impl: PromptImplementation) -> None:
    """Refuse a prompt spec that could only fail at run time.

    Its output must be an object (it is the structured-output schema); it must
    be allowed one model call with room for a reply; its templates may only
    name input fields the input schema declares; its few-shot examples must
    keep the contract; its examples call a model, so they are ``network``.
    """
    if spec.output_schema.get("type") != "object":
        raise ValueError(
            "output_schema: a prompt worker's output is a JSON object (the structured-output "
            'schema): give it "type": "object"'
        )
    c = spec.constraints
    if "language_model" not in c.tools_allowed:
        raise ValueError(
            'constraints.tools_allowed: a prompt worker needs "language_model" in its allow-list'
        )
    if c.max_external_calls is not None and c.max_external_calls < 1:
        raise ValueError(
            "constraints.max_external_calls: a prompt worker makes one model call per "
            f"attempt; {c.max_external_calls} allows none"
        )
    if c.max_tokens is not None and c.max_tokens < 1:
        raise ValueError(
            f"constraints.max_tokens: {c.max_tokens} leaves the model no tokens to reply with"
        )
    props = spec.input_schema.get("properties")
    declared = props if isinstance(props, dict) else {}
    if declared.get(FEEDBACK_FIELD, FEEDBACK_SCHEMA) != FEEDBACK_SCHEMA:
        raise ValueError(
            f"input_schema.properties.{FEEDBACK_FIELD}: reserved for the validation loop's "
            "reasons, which every prompt worker accepts; leave it out (to receive them in a "
            "field of your own, name that field in the step's validate.feedback_field)"
        )
    for name in ("system", "prompt"):
        text = getattr(impl, name)
        if text is None:
            continue
        try:
            refs = find_refs(text, TEMPLATE_ROOTS)
        except ReferenceError_ as e:
            raise ValueError(f"implementation.{name}: {e}") from None
        for ref in refs:
            problem = _undeclared(spec.input_schema, ref.path)
            if problem:
                raise ValueError(f"implementation.{name}: ${{{{ {ref.text} }}}} {problem}")
    inputs = safe_schema.validator(spec.input_schema)
    outputs = safe_schema.validator(spec.output_schema)
    for i, shot in enumerate(impl.few_shot):
        for what, validator, value in (
            ("input", inputs, shot.input),
            ("output", outputs, shot.output),
        ):
            err = safe_schema.first_error(validator, value)
            if err is not None:
                raise ValueError(f"implementation.few_shot[{i}].{what}{_path(err)}: {err.message}")
    for i, ex in enumerate(spec.examples):
        if not ex.network:
            raise ValueError(
                f"examples[{i}].network: a prompt worker's example calls a model: mark it "
                '"network": true, so that the conformance kit runs it only when asked'
            )


def _undeclared(schema: dict[str, Any], path: tuple[str | int, ...]) -> str | None:
    """Why ``input.<path>`` names nothing ``schema`` declares, or None.

    The first segment must be in ``properties``. Deeper segments are checked
    as far as the schema spells its shape out (``properties``, ``items``);
    only a closed object (``additionalProperties: false``) refuses an
    undeclared name, and a schema that composes (``$ref``, ``allOf``, ...)
    is taken on trust from there.
    """
    node: Any = schema
    for depth, seg in enumerate(path):
        if not isinstance(node, dict):
            return None
        if isinstance(seg, int):
            if depth == 0:
                return "indexes the input, which is an object: name a field (input.<field>)"
            items = node.get("items")
            if not isinstance(items, dict):
                return None
            node = items
            continue
        props = node.get("properties")
        props = props if isinstance(props, dict) else {}
        if seg in props:
            node = props[seg]
            continue
        where = "input" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[:depth])
        if depth == 0:
            return f"names input field {seg!r}, which input_schema.properties does not declare" + (
                f" (declared: {', '.join(sorted(props))})" if props else ""
            )
        if node.get("additionalProperties") is False and not node.get("patternProperties"):
            known = ", ".join(sorted(props)) or "none"
            return f"names {seg!r}, which {where} does not have (declared: {known})"
        return None
    return None
