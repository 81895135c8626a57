"""Envelopes on the wire: optional fields that hold an empty default are left out.

A pipeline's history carries every request, response and step result; most of
their optional fields hold their defaults (``null``, ``false``, ``0``, ``[]``,
``{}``, usage all zeros, no constraints), which made the payloads several
times the size of the data. :func:`compact_exclude` names those fields so the
payload converter leaves them out of :data:`COMPACT_MODELS`' JSON.

Decoding is unchanged: an absent optional field takes its default, so the
model read back equals the one written, and payloads written with every field
(older histories, external workers, other SDKs) decode as before. Required
fields always stay, and so do optional fields whose default is not empty
(``version: "1"``, ``tenant: "default"``, ``attempt: 1``): a reader that takes
an absent field as empty (``null``, ``false``, ``0``, ``[]``, ``{}``) reads
what was meant without knowing the defaults, and the exported JSON Schemas
(``schemas/json``), which require only the required fields, validate both forms.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

from pydantic.fields import FieldInfo

from aiworker.schemas.base import Model
from aiworker.schemas.limits import RunConfig
from aiworker.schemas.pipeline import PipelineResult, StepResult
from aiworker.schemas.protocol import WorkerRequest, WorkerResponse

# The envelopes written compact: every reader decodes them with their model
# (the SDK's result and argument types, PipelineClient, the worker runtime). The
# run config too: the marker every pipeline records at its start, read back by the
# workflow (its result type) and PipelineClient.recorded_specs, both with the model.
COMPACT_MODELS: tuple[type[Model], ...] = (
    WorkerRequest,
    WorkerResponse,
    StepResult,
    PipelineResult,
    RunConfig,
)

# pydantic's exclude argument: field name -> True (leave out) or a nested exclude
Exclude = dict[Any, Any]


def compact_exclude(value: Model) -> Exclude:
    """The ``exclude`` that leaves out ``value``'s optional fields holding an empty
    default, in it and in the contract models it holds (nested, in lists and dicts)."""
    out: Exclude = {}
    shape = _shape(type(value))
    for name, default in shape.empty_defaults:
        if getattr(value, name) == default:
            out[name] = True
    for name in shape.nested:
        if name in out:
            continue
        inner = _nested_exclude(getattr(value, name))
        if inner:
            out[name] = inner
    return out


def _nested_exclude(value: Any) -> Exclude | None:
    if isinstance(value, Model):
        return compact_exclude(value) or None
    if isinstance(value, (list, tuple)):
        items = {i: _nested_exclude(v) for i, v in enumerate(value)}
        return {i: e for i, e in items.items() if e} or None
    if isinstance(value, dict):
        entries = {k: _nested_exclude(v) for k, v in value.items()}
        return {k: e for k, e in entries.items() if e} or None
    return None


class _Shape(typing.NamedTuple):
    empty_defaults: tuple[tuple[str, Any], ...]  # optional fields whose default is empty
    nested: tuple[str, ...]  # fields whose type may hold a contract model


@functools.cache
def _shape(cls: type[Model]) -> _Shape:
    """What :func:`compact_exclude` looks at in ``cls``: computed once per class."""
    empty = []
    nested = []
    for name, info in cls.model_fields.items():
        if not info.is_required():
            default = _default_of(info)
            if _is_empty(default):
                empty.append((name, default))
        if _holds_model(info.annotation):
            nested.append(name)
    return _Shape(tuple(empty), tuple(nested))


def _default_of(info: FieldInfo) -> Any:
    # the factories of contract fields are pure (list, dict, Usage, RequestConstraints)
    return info.get_default(call_default_factory=True, validated_data={})


def _is_empty(default: Any) -> bool:
    if isinstance(default, Model):
        shape = _shape(type(default))
        return len(shape.empty_defaults) == len(type(default).model_fields) and all(
            getattr(default, n) == d for n, d in shape.empty_defaults
        )
    if isinstance(default, (bool, int, float)) or default is None:
        return not default
    if isinstance(default, (str, list, dict, tuple)):
        return len(default) == 0
    try:
        return bool(default == 0)  # Decimal(0)
    except TypeError:
        return False


def _holds_model(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, Model):
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        return any(_holds_model(a) for a in typing.get_args(annotation))
    return False


__all__ = ["COMPACT_MODELS", "compact_exclude"]
