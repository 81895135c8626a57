"""References in pipeline JSON: ``${{ inputs.url }}``, ``${{ steps.a.outputs.x }}``.

A string that is exactly one reference becomes the referenced JSON value of
any type; a reference inside a longer string is interpolated as text;
``$${{`` is a literal ``${{``. Nothing else is special, so JSON Schemas with
their own ``$ref`` pass through untouched. Pure functions: safe in workflows.
The module is long on purpose: the grammar, the bounded walks and the one
reading of a path (:func:`walk`, shared by resolution and the check before a
run) are one unit.

Bounded on purpose, because the spec check and :func:`resolve` run inside the
workflow task (:mod:`aiworker.schemas.caps` has the numbers):

- The scan is one pass with ``str.find`` (a hand-written scanner rather than a
  regular expression: a lazy ``${{(.*?)}}`` rescans to the end of the string
  for every unclosed opener, quadratic in the string). A token runs from its
  opener to the first ``}}``; an unclosed ``${{`` is an error, found once.
- :func:`find_refs` and :func:`resolve` walk JSON with an explicit depth: a
  value nested deeper than the cap is refused before anything recurses past it.
- :func:`resolve` counts the compact-JSON size of what it produces (referenced
  values are measured, once each, before they are copied or interpolated) and
  stops at the cap: an oversized value is never built.

Errors: :class:`ReferenceError_` (a malformed or unresolvable reference),
:class:`ReferenceLimitError` (a structural cap: ``invalid_input``, never a
skipped step) and :class:`ResolvedSizeError` (``payload_too_large``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiworker.schemas.caps import MAX_REFERENCES_PER_STRING, SETTING_OF, Caps

_SEGMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*|[0-9]+")
_OPEN = "${{"
_CLOSE = "}}"
# What a pipeline step may refer to; a prompt worker's template refers to `input`.
PIPELINE_ROOTS = ("inputs", "steps", "item", "item_index")
TEMPLATE_ROOTS = ("input",)
_CEILINGS = Caps.ceilings()
# What steps.<id>. may be followed by (token and callback_url: a wait step's, while it waits).
_STEP_FIELDS = ("outputs", "status", "warnings", "artifacts", "token", "callback_url")


class ReferenceError_(ValueError):
    """A reference that cannot be parsed or resolved."""

    code = "invalid_input"


class ReferenceLimitError(ReferenceError_):
    """A value over a structural cap (length, count, nesting): ``invalid_input``."""


class ResolvedSizeError(ReferenceLimitError):
    """A resolved value over its size cap: ``payload_too_large``."""

    code = "payload_too_large"


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
    normalized = re.sub(r"\[([0-9]+)\]", r".\1", text)
    parts = normalized.split(".")
    segments: list[str | int] = []
    for p in parts:
        if not _SEGMENT.fullmatch(p):
            raise ReferenceError_(f"bad reference {_short(text)!r}: segment {_short(p)!r}")
        segments.append(int(p) if p.isdigit() else p)
    root = segments[0]
    if root not in roots:
        raise ReferenceError_(
            f"bad reference {_short(text)!r}: must start with "
            + (" or ".join([", ".join(roots[:-1]), roots[-1]]) if len(roots) > 1 else roots[0])
        )
    path = tuple(segments[1:])
    if root == "steps":
        if len(path) < 2 or path[1] not in _STEP_FIELDS:
            raise ReferenceError_(
                f"bad reference {_short(text)!r}: use steps.<id>.outputs[.<path>] "
                "or steps.<id>.status"
            )
        if path[1] in ("token", "callback_url") and len(path) != 2:
            raise ReferenceError_(f"bad reference {_short(text)!r}: {path[1]} has no fields")
    if root == "item_index" and path:
        raise ReferenceError_(f"bad reference {text!r}: item_index has no fields")
    return Ref(text=text, root=str(root), path=path)


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


# A for_each resolves the same template once per item: short strings are parsed
# once. Long ones are not kept (the cache would hold them), and parse in one pass.
_CACHED_CHARS = 4096


def parse_template(text: str, roots: tuple[str, ...] = PIPELINE_ROOTS) -> tuple[str | Ref, ...]:
    """``text`` as literal pieces and references, in order, in one pass.

    Empty for a string without any ``${{`` (the common case, and the caller's
    cue to use the string as it is). Escaped tokens (``$${{ ... }}``) come back
    as literal text without their first ``$``.

    Raises:
        ReferenceError_: a malformed reference or an unclosed ``${{``.
        ReferenceLimitError: more than ``MAX_REFERENCES_PER_STRING`` references.
    """
    if len(text) <= _CACHED_CHARS:
        return _parse_cached(text, roots)
    return _parse(text, roots)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str, roots: tuple[str, ...]) -> tuple[str | Ref, ...]:
    return _parse(text, roots)


def _parse(text: str, roots: tuple[str, ...]) -> tuple[str | Ref, ...]:
    parts: list[str | Ref] = []
    literal: list[str] = []
    pos = 0
    refs = 0
    # Each find starts where the last one stopped: every character is looked at
    # a bounded number of times, whatever the string holds.
    while (i := text.find(_OPEN, pos)) >= 0:
        escaped = i > pos and text[i - 1] == "$"
        start = i - 1 if escaped else i
        literal.append(text[pos:start])
        close = text.find(_CLOSE, i + len(_OPEN))
        if close < 0:
            if not escaped:
                raise ReferenceError_(f"unclosed ${{{{ at character {i} (no }}}} after it)")
            close, end = len(text), len(text)
        else:
            end = close + len(_CLOSE)
        if escaped:
            literal.append(text[start + 1 : end])
        else:
            refs += 1
            if refs > MAX_REFERENCES_PER_STRING:
                raise ReferenceLimitError(
                    f"more than {MAX_REFERENCES_PER_STRING} references in one string"
                )
            if lit := "".join(literal):
                parts.append(lit)
            literal = []
            parts.append(parse_ref(text[i + len(_OPEN) : close], roots))
        pos = end
    if not parts and not literal:
        return ()
    literal.append(text[pos:])
    if lit := "".join(literal):
        parts.append(lit)
    return tuple(parts)


def find_refs(
    value: Any, roots: tuple[str, ...] = PIPELINE_ROOTS, caps: Caps = _CEILINGS
) -> list[Ref]:
    """Every reference inside a JSON value.

    Walks without recursion and checks ``caps``: nesting (``max_json_depth``)
    and the length of a string that holds references (``max_reference_chars``).

    Raises:
        ReferenceError_: a malformed reference.
        ReferenceLimitError: a value over one of ``caps``.
    """
    out: list[Ref] = []
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            parts = parse_template(v, roots)
            if parts and len(v) > caps.max_reference_chars:
                raise ReferenceLimitError(
                    f"a string of {len(v)} characters holds references; the cap is "
                    f"{caps.max_reference_chars}"
                )
            out.extend(p for p in parts if isinstance(p, Ref))
            continue
        if isinstance(v, Mapping | list):
            if depth >= caps.max_json_depth:
                raise _too_deep(caps.max_json_depth)
            children = list(v.values()) if isinstance(v, Mapping) else v
            stack.extend((c, depth + 1) for c in reversed(children))
    return out


def json_depth(value: Any, limit: int) -> int:
    """The nesting of ``value`` (a scalar is 0, ``[]`` is 1), walked without recursion.

    Raises:
        ReferenceLimitError: ``value`` nests deeper than ``limit``.
    """
    if not isinstance(value, Mapping | list):
        return 0
    deepest = 0
    # Only containers go on the stack, and plain dicts, lists and scalars are told
    # by their exact type first: this walk runs on every worker call's input and
    # output, and the ABC check per value was most of its cost.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            raise _too_deep(limit)
        if depth > deepest:
            deepest = depth
        children = v.values() if type(v) is dict or isinstance(v, Mapping) else v
        for c in children:
            t = type(c)
            if t is str or t is int or t is float or t is bool or c is None:
                continue
            if t is dict or t is list or isinstance(c, Mapping | list):
                stack.append((c, depth + 1))
    return deepest


def _too_deep(limit: int) -> ReferenceLimitError:
    return ReferenceLimitError(f"JSON nested deeper than {limit} levels")


@dataclass(frozen=True)
class Gap:
    """Where a reference's path stops resolving: ``walked`` resolved (``inputs.a``),
    ``container`` (the value there) has no ``seg``."""

    walked: str
    seg: str | int
    container: Any


def walk(ref: Ref, root_value: Any) -> tuple[Any, Gap | None]:
    """Follow ``ref.path`` from its root's value: the value found, or the gap.

    The one reading of a path: the run's resolution and the check before it
    (``inputs`` are never resolved themselves, so the check finds what a run will).
    """
    cur, walked = root_value, ref.root
    for seg in ref.path:
        if isinstance(cur, Mapping) and str(seg) in cur:
            cur = cur[str(seg)]
        elif isinstance(cur, list) and isinstance(seg, int) and -len(cur) <= seg < len(cur):
            cur = cur[seg]
        else:
            return None, Gap(walked, seg, cur)
        walked = f"{walked}.{seg}"
    return cur, None


def _lookup(ref: Ref, scope: Mapping[str, Any]) -> Any:
    if ref.root not in scope:
        raise ReferenceError_(f"{ref.text}: {ref.root} is not available here")
    value, gap = walk(ref, scope[ref.root])
    if gap is not None:
        raise ReferenceError_(f"{ref.text}: {gap.walked} has no {gap.seg!r}")
    return value


def _as_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


@dataclass
class SizeBudget:
    """What one resolution may still produce, in compact-JSON characters.

    A budget made with :meth:`part` also counts against its parent (each
    for_each item's input against the step's whole input); referenced values
    are measured once per budget family.
    """

    max_bytes: int
    max_depth: int = _CEILINGS.max_json_depth
    cap: str = "max_resolved_bytes"  # the Caps field max_bytes comes from, for messages
    used: int = 0
    parent: SizeBudget | None = None
    # id -> (the value, its size, its nesting); holding the value keeps its id
    # from being reused by another object while this budget lives.
    _sizes: dict[int, tuple[Any, int, int]] = field(default_factory=dict)

    def part(self, max_bytes: int) -> SizeBudget:
        """A budget of at most ``max_bytes`` that also counts against this one."""
        return SizeBudget(max_bytes, self.max_depth, parent=self, _sizes=self._sizes)

    def take(self, n: int) -> None:
        """Count ``n`` more characters; ``ResolvedSizeError`` past the cap."""
        self.used += n
        if self.used > self.max_bytes:
            what = "resolves" if self.cap == "max_resolved_bytes" else "with its items resolves"
            raise ResolvedSizeError(
                f"{what} to more than {self.max_bytes} bytes, the cap ({SETTING_OF[self.cap]})"
            )
        if self.parent is not None:
            self.parent.take(n)

    def measure(self, value: Any) -> tuple[int, int]:
        """(compact-JSON size, nesting) of a referenced value; stops once it alone
        passes what is left, so a huge value costs no more than the cap to refuse."""
        if isinstance(value, str):
            return len(value) + 2, 0
        known = self._sizes.get(id(value))
        if known is not None:
            return known[1], known[2]
        left = self.max_bytes - self.used
        size = deepest = 0
        stack: list[tuple[Any, int]] = [(value, 0)]
        while stack:
            v, depth = stack.pop()
            if isinstance(v, Mapping):
                size += 2 + max(0, len(v) - 1) + sum(len(str(k)) + 3 for k in v)
                stack.extend((c, depth + 1) for c in v.values())
            elif isinstance(v, list):
                size += 2 + max(0, len(v) - 1)
                stack.extend((c, depth + 1) for c in v)
            else:
                size += len(v) + 2 if isinstance(v, str) else _scalar_size(v)
            if isinstance(v, Mapping | list):
                deepest = max(deepest, depth + 1)
                if deepest > self.max_depth:
                    raise _too_deep(self.max_depth)
            if size > left:
                self.take(size)  # raises: the value alone is over what is left
        if isinstance(value, Mapping | list):
            self._sizes[id(value)] = (value, size, deepest)
        return size, deepest


def _scalar_size(v: Any) -> int:
    if v is None or v is True:
        return 4
    if v is False:
        return 5
    return len(repr(v))


def resolve(
    value: Any,
    scope: Mapping[str, Any],
    roots: tuple[str, ...] = PIPELINE_ROOTS,
    budget: SizeBudget | None = None,
) -> Any:
    """Replace every reference in ``value`` with its value from ``scope``.

    ``scope`` maps roots to values: ``inputs``, ``steps`` (``{id: {outputs, status}}``),
    and inside ``for_each`` ``item`` and ``item_index``. ``budget`` caps the
    result's size and nesting (by default the hard ceilings).

    Raises:
        ReferenceError_: a reference that cannot be resolved.
        ReferenceLimitError: the result would nest deeper than the cap.
        ResolvedSizeError: the result would be larger than the cap.
    """
    if budget is None:
        budget = SizeBudget(_CEILINGS.max_resolved_bytes)
    return _resolve(value, scope, roots, budget, 0)


def _resolve(
    value: Any, scope: Mapping[str, Any], roots: tuple[str, ...], budget: SizeBudget, depth: int
) -> Any:
    if isinstance(value, str):
        parts = parse_template(value, roots)
        if not parts:
            budget.take(len(value) + 2)
            return value
        if len(parts) == 1 and isinstance(parts[0], Ref):
            found = _lookup(parts[0], scope)
            size, nesting = budget.measure(found)
            if depth + nesting > budget.max_depth:
                raise _too_deep(budget.max_depth)
            budget.take(size)
            return found
        budget.take(2)
        pieces: list[str] = []
        for p in parts:
            if isinstance(p, str):
                budget.take(len(p))
                pieces.append(p)
                continue
            found = _lookup(p, scope)
            # Measured before it is turned into text: never build what the cap refuses.
            size = len(found) if isinstance(found, str) else budget.measure(found)[0]
            budget.take(size)
            pieces.append(_as_text(found))
        return "".join(pieces)
    if isinstance(value, Mapping | list):
        if depth >= budget.max_depth:
            raise _too_deep(budget.max_depth)
        if isinstance(value, Mapping):
            budget.take(2 + sum(len(str(k)) + 4 for k in value))
            return {k: _resolve(v, scope, roots, budget, depth + 1) for k, v in value.items()}
        budget.take(2 + len(value))
        return [_resolve(v, scope, roots, budget, depth + 1) for v in value]
    budget.take(_scalar_size(value))
    return value
