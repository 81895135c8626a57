"""Flow control on pipeline starts: the ``flow`` field of a pipeline and its key.

One mode per pipeline (``debounce``, ``batch``, ``singleton`` or ``throttle``),
keyed by a ``${{ inputs.<path> }}`` reference resolved from the start's inputs
(docs/flow-control.md). This module holds the declaration, its bounds and the
key's resolution into a value safe for a Temporal workflow id; nothing here
starts anything.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final, Literal

from pydantic import Field, model_validator

from aiworker.schemas.base import Model
from aiworker.schemas.refs import ReferenceError_, find_refs, resolve

MAX_KEY_CHARS: Final = 200
"""A resolved key longer than this (after JSON encoding) is refused at start."""
MAX_PERIOD_SECONDS: Final = 86_400
"""Every period (debounce quiet time and max wait, batch wait, throttle period): 1 s to 1 day."""
MAX_BATCH_ITEMS: Final = 1_000
MAX_THROTTLE_STARTS: Final = 10_000
_SAFE_KEY: Final = re.compile(r"^[A-Za-z0-9_.@:-]{1,64}$")


class Debounce(Model):
    """Starts within ``seconds`` of each other for one key collapse into one run."""

    seconds: int = Field(
        ge=1, le=MAX_PERIOD_SECONDS, description="the run starts once the key is quiet this long"
    )
    max_wait_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PERIOD_SECONDS,
        description="the run starts at the latest this long after the first start; "
        "unset: no maximum; at least `seconds`",
    )
    inputs: Literal["last", "all"] = Field(
        default="last",
        description="`last`: the run gets the last start's inputs; `all`: every start's "
        "inputs, oldest first, as the list `inputs.starts`",
    )

    @model_validator(mode="after")
    def _max_wait_not_below_quiet(self) -> Debounce:
        if self.max_wait_seconds is not None and self.max_wait_seconds < self.seconds:
            raise ValueError(
                f"max_wait_seconds ({self.max_wait_seconds}) is below seconds ({self.seconds})"
            )
        return self


class Batch(Model):
    """Starts for one key collect until ``max_items`` or ``max_seconds``; one run gets them."""

    max_items: int = Field(
        ge=2, le=MAX_BATCH_ITEMS, description="the run starts when this many starts collected"
    )
    max_seconds: int = Field(
        ge=1,
        le=MAX_PERIOD_SECONDS,
        description="or this long after the batch's first start; the run gets every start's "
        "inputs, oldest first, as the list `inputs.starts`",
    )


class Throttle(Model):
    """At most ``max_starts`` runs per key start per ``period_seconds``; the rest queue."""

    max_starts: int = Field(ge=1, le=MAX_THROTTLE_STARTS, description="runs started per period")
    period_seconds: int = Field(ge=1, le=MAX_PERIOD_SECONDS, description="the period")


class Flow(Model):
    """How starts of a pipeline with the same key are combined (one mode)."""

    key: str = Field(
        min_length=1,
        max_length=MAX_KEY_CHARS,
        description="a ${{ inputs.<path> }} reference (or a literal: one key for all "
        "starts); resolved from each start's inputs",
    )
    debounce: Debounce | None = Field(default=None, description="collapse close starts")
    batch: Batch | None = Field(default=None, description="collect starts into one run")
    singleton: Literal["wait", "refuse", "cancel_running"] | None = Field(
        default=None,
        description="at most one run per key: a new start waits, is refused, or cancels "
        "the running one",
    )
    throttle: Throttle | None = Field(default=None, description="queue starts over a rate")

    @model_validator(mode="after")
    def _one_mode(self) -> Flow:
        modes = self.modes()
        if len(modes) != 1:
            raise ValueError(
                "exactly one of debounce, batch, singleton, throttle; got "
                + (", ".join(modes) or "none")
            )
        return self

    def modes(self) -> list[str]:
        """The modes set (exactly one on a valid ``Flow``)."""
        return [
            m
            for m in ("debounce", "batch", "singleton", "throttle")
            if getattr(self, m) is not None
        ]

    def key_problems(self) -> list[str]:
        """What is wrong with ``key`` before any start: a reference outside inputs."""
        try:
            refs = find_refs(self.key)
        except ReferenceError_ as e:
            return [str(e)]
        return [
            f"{ref.text} is not known when the pipeline starts (use inputs)"
            for ref in refs
            if ref.root != "inputs"
        ]


class FlowKeyError(ValueError):
    """A key that resolves to nothing or to a value over :data:`MAX_KEY_CHARS`
    (error code ``invalid_input``: bad input, never internal)."""


def resolve_key(flow: Flow, inputs: dict[str, Any]) -> str:
    """The start's key as text: a string as is, anything else JSON-encoded.

    Raises:
        FlowKeyError: the reference does not resolve, resolves to null/empty,
            or to more than :data:`MAX_KEY_CHARS` characters.
    """
    try:
        value = resolve(flow.key, {"inputs": inputs}, roots=("inputs",))
    except (ReferenceError_, ValueError) as e:
        raise FlowKeyError(f"flow.key {flow.key} does not resolve: {e}") from e
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if value is None or text in ("", "[]", "{}"):
        raise FlowKeyError(f"flow.key {flow.key} resolves to nothing ({json.dumps(value)})")
    if len(text) > MAX_KEY_CHARS:
        raise FlowKeyError(
            f"flow.key {flow.key} resolves to {len(text)} characters; at most {MAX_KEY_CHARS}"
        )
    return text


def key_id_part(key: str) -> str:
    """The key as a workflow-id segment: short plain keys as is, others hashed.

    A key of letters, digits and ``_.@:-`` up to 64 characters stays readable in
    the Temporal UI; any other is replaced by ``h-`` and 32 hex digits of its
    SHA-256, so two different keys never share an id segment in practice.
    """
    if _SAFE_KEY.match(key) and not key.startswith("h-"):
        return key
    return "h-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def flow_workflow_id(tenant: str, pipeline: str, key: str, queue_suffix: str = "") -> str:
    """The id of the keyed flow workflow for (tenant, pipeline, key) in one deployment
    (``queue_suffix``, as the limiter's id carries it: an isolated stack on the same
    namespace keeps its own); ``singleton: refuse`` gives this id to the run itself."""
    return f"flow{queue_suffix}/{tenant}/{pipeline}/{key_id_part(key)}"


def mode_of(flow: Flow) -> str:
    """The flow's mode as one word: ``debounce``, ``batch``, ``throttle``, or
    ``singleton:<wait|refuse|cancel_running>``."""
    mode = flow.modes()[0]
    return f"singleton:{flow.singleton}" if mode == "singleton" else mode


def collects(flow: Flow) -> bool:
    """Whether a run of this flow gets every start's inputs as ``inputs.starts``
    (``batch``, ``debounce`` with ``inputs: all``)."""
    return flow.batch is not None or (flow.debounce is not None and flow.debounce.inputs == "all")


STARTS_INPUT: Final = "starts"
"""The input under which a collecting run gets every start's inputs, oldest first."""


def run_inputs(last: dict[str, Any], collected: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The inputs a flow-started run gets: the last start's, and with ``collected``
    (a collecting flow) every start's inputs, oldest first, as ``starts``."""
    if collected is None:
        return dict(last)
    return {**last, STARTS_INPUT: list(collected)}
