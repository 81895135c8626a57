"""What a step's outputs look like, as far as its input decides it.

A worker's ``output_schema`` says what any call may return; for the built-in
workers the step's own input often says more. The pipeline check
(:mod:`~aiworker.schemas.step_inputs`) holds a ``${{ steps.<id>.outputs... }}``
reference against :func:`output_shape`, so a misspelled key is refused before
anything runs, with the nearest name::

    steps.read.outputs.data.contnet.markdown: the data of web-scrape step 'read'
    has no outputs.data.contnet (it has: content) (did you mean 'content'?)

What is derived (read off the workers' code, ``activities/``):

- **web-scrape** ``data``: one key per ``extraction_spec.fields`` name (a record
  field's sub-fields, a ``many`` field a list), ``metadata`` with ``metadata:
  true``, ``content`` (``mode``, ``text``, ``markdown``, ``title``, ``byline``,
  ``published``, ``language``) with ``content``, ``urls`` with ``discover``.
- **llm-call** ``json``: the literal ``response_schema``; without one the step
  has no ``json`` (its reply is ``text``).
- **aggregator**: the keys its ``policy`` returns (``votes`` only for
  ``quorum``/``majority``, ``conflicts`` for ``merge``, ``duplicates_removed``
  for ``concat``); ``result`` of ``all`` is the ``branches`` as given (their
  names, and each branch's own shape where it is a reference to a step).
- **prompt and plugin workers**: their declared ``output_schema``, as it is.

Permissive wherever the input does not decide: a reference where a key or a
field list stands, a field with a ``default`` (any value), a ``for_each`` or
``fallback`` step (another worker's outputs), an ``escalate`` step (a reviewer
may approve other outputs). Such a place is an open schema (``{}``), and the
check refuses a reference only where a schema says ``additionalProperties:
false``: a valid pipeline is never refused.

The shapes are JSON Schema fragments that are only walked (never compiled nor
changed: they share the declared schemas' parts, copied shallowly);
:data:`ORIGIN` marks a closed object with what it was derived from, for the
message. Pure and deterministic: it runs inside the workflow sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiworker.schemas import names
from aiworker.schemas.pipeline import Step
from aiworker.schemas.refs import Ref, ReferenceError_, parse_template
from aiworker.schemas.spec import WorkerSpec

# The key of a derived object that says where its keys come from (for the message).
ORIGIN = "x-aiworker-origin"
# How deep one step's shape follows references into other steps' shapes
# (an aggregator of aggregators): beyond it, open. Bounds the recursion.
MAX_FOLLOW = 8

OPEN: dict[str, Any] = {}

# web-scrape's data.content (activities/tools/content.py, extract_content and _empty)
CONTENT_KEYS = ("mode", "text", "markdown", "title", "byline", "published", "language")
# web-scrape's data.metadata (activities/tools/extract.py, metadata)
METADATA_KEYS = ("title", "description", "canonical_url", "language", "opengraph", "json_ld")
# aggregator: the keys each policy returns besides policy, result, used and failed
_POLICY_KEYS = {
    "all": (),
    "first_success": (),
    "quorum": ("votes",),
    "majority": ("votes",),
    "merge": ("conflicts",),
    "concat": ("duplicates_removed",),
}


def closed(props: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """An object of exactly ``props`` (some may be absent), made by ``origin``."""
    return {
        "type": "object",
        "properties": dict(props),
        "additionalProperties": False,
        ORIGIN: origin,
    }


def _whole_ref(value: Any) -> Ref | None:
    """The reference ``value`` is exactly (``"${{ steps.a.outputs }}"``), if it is one."""
    if not isinstance(value, str) or "${{" not in value:
        return None
    try:
        parts = parse_template(value)
    except ReferenceError_:
        return None
    return parts[0] if len(parts) == 1 and isinstance(parts[0], Ref) else None


def _varies(value: Any) -> bool:
    """Whether ``value`` is (or holds) a reference: its resolved value is not known."""
    if isinstance(value, str):
        try:
            return any(isinstance(p, Ref) for p in parse_template(value))
        except ReferenceError_:
            return True
    if isinstance(value, dict):
        return any(_varies(v) for v in value.values())
    if isinstance(value, list):
        return any(_varies(v) for v in value)
    return False


class Shapes:
    """The output shapes of a pipeline's steps, each derived once.

    Args:
        steps: the pipeline's steps by id.
        workers: the workers' specs by id (None: known by name only).

    The built-in workers' shapes are narrowed by the steps' inputs.
    """

    def __init__(
        self,
        steps: Mapping[str, Step],
        workers: Mapping[str, WorkerSpec | None],
    ) -> None:
        self._steps = steps
        self._workers = workers
        self._done: dict[str, tuple[Any, str] | None] = {}

    def of(self, step_id: str, depth: int = 0) -> tuple[Any, str] | None:
        """The shape of step ``step_id``'s outputs and whose it is (for the message:
        ``the output_schema of worker 'x'``); None when nothing is known.

        Each step is derived once; a step met again while it is being derived (a
        cycle, refused elsewhere) or past :data:`MAX_FOLLOW` references is open,
        so the work is linear in the references whatever the pipeline."""
        if step_id in self._done:
            return self._done[step_id]
        step = self._steps.get(step_id)
        if step is not None and step.wait is not None:
            # a wait step's outputs are what its callback brought, held to wait.schema
            # (a for_each's are a list of them: another shape)
            whose = f"the wait.schema of step {step_id!r}"
            found = None if step.for_each is not None else (step.wait.schema_, whose)
            self._done[step_id] = found
            return found
        worker = self._workers.get(step.worker) if step is not None else None
        if step is None or worker is None or depth > MAX_FOLLOW:
            return None
        if step.for_each is not None or step.fallback is not None:
            self._done[step_id] = None  # another shape than the worker's
            return None
        declared = (worker.output_schema, f"the output_schema of worker {worker.worker_id!r}")
        # an escalated step: a reviewer may approve any outputs its output_schema allows
        if step.on_failure == "escalate":
            self._done[step_id] = declared
            return declared
        self._done[step_id] = None  # while it is being derived
        derived = self._derive(step, worker, depth)
        found = (derived, declared[1]) if derived is not None else declared
        self._done[step_id] = found
        return found

    def _derive(self, step: Step, worker: WorkerSpec, depth: int) -> Any:
        """The worker's output_schema narrowed by the step's input; None: as declared."""
        if worker.worker_id == names.WEB_SCRAPE:
            return _web_scrape(step, worker.output_schema)
        if worker.worker_id == names.LLM_CALL:
            return _llm_call(step, worker.output_schema)
        if worker.worker_id == names.AGGREGATOR:
            return self._aggregator(step, worker.output_schema, depth)
        return None

    # --- aggregator -----------------------------------------------------------------------------

    def _aggregator(self, step: Step, declared: Any, depth: int) -> Any:
        policy, branches = step.input.get("policy"), step.input.get("branches")
        if not isinstance(policy, str) or policy not in _POLICY_KEYS:
            return None
        props = declared.get("properties") if isinstance(declared, dict) else None
        if not isinstance(props, dict):
            return None
        keep = {"policy", "result", "used", "failed", *_POLICY_KEYS[policy]}
        shape = {k: v for k, v in props.items() if k in keep}
        if policy == "all":
            origin = f"the branches of aggregator step {step.id!r}"
            shape["result"] = self.value_shape(branches, origin, depth + 1)
        return closed(shape, f"aggregator step {step.id!r} (policy {policy!r})")

    def value_shape(self, value: Any, origin: str, depth: int = 0) -> Any:
        """The shape of ``value`` once its references resolve: a literal object's keys,
        a referenced step's outputs (at the reference's path), open where unknown."""
        if depth > MAX_FOLLOW:
            return OPEN
        if isinstance(value, dict):
            # the keys are as written; the values' shapes as far as known
            return closed(
                {str(k): self.value_shape(v, origin, depth + 1) for k, v in value.items()},
                origin,
            )
        if isinstance(value, list):
            return {"type": "array"}
        ref = _whole_ref(value)
        if ref is None or ref.step_id is None or len(ref.path) < 2 or ref.path[1] != "outputs":
            return OPEN
        found = self.of(ref.step_id, depth + 1)
        if found is None:
            return OPEN
        return descend(found[0], ref.path[2:])


def descend(schema: Any, path: tuple[str | int, ...]) -> Any:
    """The part of ``schema`` at ``path``, as far as plainly known; open otherwise."""
    for seg in path:
        if not isinstance(schema, dict) or set(schema) & {"$ref", "anyOf", "oneOf", "allOf", "if"}:
            return OPEN
        props = schema.get("properties") or {}
        if isinstance(seg, str) and isinstance(props, dict) and seg in props:
            schema = props[seg]
        elif isinstance(seg, int) and schema.get("type") == "array":
            schema = schema.get("items", OPEN)
        else:
            return OPEN
    return schema


# --- web-scrape -------------------------------------------------------------------------------


def _web_scrape(step: Step, declared: Any) -> Any:
    data = _scrape_data(step)
    if data is None or not isinstance(declared, dict):
        return None
    # shallow copies: the shapes are only read, and the declared schema stays as it is
    props = declared.get("properties")
    return {**declared, "properties": {**(props if isinstance(props, dict) else {}), "data": data}}


def _scrape_data(step: Step) -> dict[str, Any] | None:
    """The keys of web-scrape's ``data`` for this input (activities/web_scrape.py);
    None when a reference decides them."""
    worker_input = step.input
    whose = f"of web-scrape step {step.id!r}"
    props: dict[str, Any] = {}
    if "extraction_spec" in worker_input:
        spec = worker_input["extraction_spec"]
        if not isinstance(spec, dict):
            return None  # a reference: any spec
        fields = spec.get("fields", {})
        if not isinstance(fields, dict):
            return None
        props.update(_fields_shape(fields, whose))
        if spec.get("metadata", False) is not False:  # true, or a reference that may be
            props["metadata"] = closed(dict.fromkeys(METADATA_KEYS, OPEN), f"data.metadata {whose}")
        if spec.get("content") is not None:  # "article", "page" or a reference
            props["content"] = closed(dict.fromkeys(CONTENT_KEYS, OPEN), f"data.content {whose}")
    if "discover" in worker_input:
        props["urls"] = {"type": "array", "items": {"type": "string"}}
    return closed(props, f"the data {whose}")


def _fields_shape(fields: dict[str, Any], whose: str) -> dict[str, Any]:
    """One key per extraction field: a record's sub-fields closed, a ``many`` field a
    list; open where a reference or a ``default`` leaves the value unknown."""
    return {str(name): _field_shape(str(name), f, whose) for name, f in fields.items()}


def _field_shape(name: str, f: Any, whose: str) -> Any:
    if not isinstance(f, dict) or "default" in f:
        return OPEN  # a selector string (any scalar), a reference, or any default
    many = f.get("many", False)
    if many is not True and many is not False:
        return OPEN  # a reference: a list or not
    if "fields" in f:
        sub = f["fields"]
        if not isinstance(sub, dict):
            return OPEN
        record = closed(_fields_shape(sub, whose), f"the record field {name!r} {whose}")
        return {"type": "array", "items": record} if many else record
    return {"type": "array"} if many else OPEN


# --- llm-call ---------------------------------------------------------------------------------


def _llm_call(step: Step, declared: Any) -> Any:
    """llm-call's ``json`` follows a literal ``response_schema`` (activities/llm_call.py:
    ``json`` is the reply checked against it); without one there is no ``json``."""
    if not isinstance(declared, dict) or not isinstance(declared.get("properties"), dict):
        return None
    schema = step.input.get("response_schema")
    props = dict(declared["properties"])  # shallow copies: the shapes are only read
    shape = {**declared, "properties": props}
    if schema is None:
        props.pop("json", None)
        shape[ORIGIN] = f"llm-call step {step.id!r} without response_schema (its reply is text)"
        return shape
    if isinstance(schema, dict) and not _varies(schema):
        props["json"] = {
            **schema,
            ORIGIN: f"the response_schema of step {step.id!r}",
        }
    return shape


__all__ = ["CONTENT_KEYS", "METADATA_KEYS", "ORIGIN", "Shapes", "closed", "descend"]
