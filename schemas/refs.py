"""References in pipeline JSON: ``${{ inputs.url }}``, ``${{ steps.a.outputs.x }}``.

A string that is exactly one reference becomes the referenced JSON value of
any type; a reference inside a longer string is interpolated as text;
``$${{`` is a literal ``${{``. Nothing else is special, so JSON Schemas with
their own ``$ref`` pass through untouched. Pure functions: safe in workflows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(r"\$?\$\{\{(.*?)\}\}", re.DOTALL)
_SEGMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*|\d+")
# What a pipeline step may refer to; a prompt worker's template refers to `input`.
PIPELINE_ROOTS = ("inputs", "steps", "item", "item_index")
TEMPLATE_ROOTS = ("input",)


class ReferenceError_(ValueError):
    """A reference that cannot be parsed or resolved."""


@dataclass(frozen=True)
class Ref:
    """A parsed reference: a root (``inputs``, ``steps``, ``item``, ``item_index``) and a path."""

    text: str
    root: str
    path: tuple[str | int, ...]

    @property
    def step_id(self) -> str | None:
        """The step a ``steps.<id>...`` reference points at."""
        if self.root == "steps" and self.path:
            return str(self.path[0])
        return None


def parse_ref(expr: str, roots: tuple[str, ...] = PIPELINE_ROOTS) -> Ref:
    """Parse the inside of ``${{ ... }}``; its first segment must be one of ``roots``."""
    text = expr.strip()
    if not text:
        raise ReferenceError_("empty reference ${{ }}")
    # a[0].b -> a.0.b
    normalized = re.sub(r"\[(\d+)\]", r".\1", text)
    parts = normalized.split(".")
    segments: list[str | int] = []
    for p in parts:
        if not _SEGMENT.fullmatch(p):
            raise ReferenceError_(f"bad reference {text!r}: segment {p!r}")
        segments.append(int(p) if p.isdigit() else p)
    root = segments[0]
    if root not in roots:
        raise ReferenceError_(
            f"bad reference {text!r}: must start with "
            + (" or ".join([", ".join(roots[:-1]), roots[-1]]) if len(roots) > 1 else roots[0])
        )
    path = tuple(segments[1:])
    if root == "steps":
        if len(path) < 2 or path[1] not in ("outputs", "status", "warnings", "artifacts"):
            raise ReferenceError_(
                f"bad reference {text!r}: use steps.<id>.outputs[.<path>] or steps.<id>.status"
            )
    if root == "item_index" and path:
        raise ReferenceError_(f"bad reference {text!r}: item_index has no fields")
    return Ref(text=text, root=str(root), path=path)


def find_refs(value: Any, roots: tuple[str, ...] = PIPELINE_ROOTS) -> list[Ref]:
    """Every reference inside a JSON value (``ReferenceError_`` on a malformed one)."""
    out: list[Ref] = []
    if isinstance(value, str):
        for m in _TOKEN.finditer(value):
            if m.group(0).startswith("$$"):
                continue
            out.append(parse_ref(m.group(1), roots))
    elif isinstance(value, Mapping):
        for v in value.values():
            out.extend(find_refs(v, roots))
    elif isinstance(value, list):
        for v in value:
            out.extend(find_refs(v, roots))
    return out


def _lookup(ref: Ref, scope: Mapping[str, Any]) -> Any:
    if ref.root not in scope:
        raise ReferenceError_(f"{ref.text}: {ref.root} is not available here")
    cur: Any = scope[ref.root]
    walked = ref.root
    for seg in ref.path:
        if isinstance(cur, Mapping) and str(seg) in cur:
            cur = cur[str(seg)]
        elif isinstance(cur, list) and isinstance(seg, int) and -len(cur) <= seg < len(cur):
            cur = cur[seg]
        else:
            raise ReferenceError_(f"{ref.text}: {walked} has no {seg!r}")
        walked = f"{walked}.{seg}"
    return cur


def _as_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def resolve(value: Any, scope: Mapping[str, Any], roots: tuple[str, ...] = PIPELINE_ROOTS) -> Any:
    """Replace every reference in ``value`` with its value from ``scope``.

    ``scope`` maps roots to values: ``inputs``, ``steps`` (``{id: {outputs, status}}``),
    and inside ``for_each`` ``item`` and ``item_index``.
    """
    if isinstance(value, str):
        matches = list(_TOKEN.finditer(value))
        if not matches:
            return value
        if len(matches) == 1 and matches[0].span() == (0, len(value)):
            m = matches[0]
            if m.group(0).startswith("$$"):
                return m.group(0)[1:]
            return _lookup(parse_ref(m.group(1), roots), scope)
        parts: list[str] = []
        last = 0
        for m in matches:
            parts.append(value[last : m.start()])
            if m.group(0).startswith("$$"):
                parts.append(m.group(0)[1:])
            else:
                parts.append(_as_text(_lookup(parse_ref(m.group(1), roots), scope)))
            last = m.end()
        parts.append(value[last:])
        return "".join(parts)
    if isinstance(value, Mapping):
        return {k: resolve(v, scope, roots) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, scope, roots) for v in value]
    return value
