"""Broken versions of JSON values and jsonschema errors compared as tuples: for the
tests that hold a contract (memo, jsonschema-rs in front) to jsonschema's answers."""

from __future__ import annotations

import copy
import random
from typing import Any

ODD = [None, 7, -1, 2.5, 0, "", "x", "é", [], {}, True, False, {"zz": 1}, ["a"], 10**3]


def error_tuples(found: list[Any]) -> list[tuple[Any, ...]]:
    """Each error as (path, message, keyword): what two checks must agree on."""
    return [(tuple(e.absolute_path), e.message, e.validator) for e in found]


def mutation(value: Any, rng: random.Random, *, reshape: bool = True) -> Any:
    """A copy of ``value`` with one random part replaced by something of another JSON
    type, or (``reshape``) dropped from its object or added to its container."""
    out = copy.deepcopy(value)
    spots: list[tuple[Any, Any]] = []
    stack = [out]
    while stack:
        v = stack.pop()
        keys = list(v) if isinstance(v, dict) else range(len(v)) if isinstance(v, list) else []
        for k in keys:
            spots.append((v, k))
            stack.append(v[k])
    if not spots:
        return rng.choice(ODD) if reshape else out
    parent, key = rng.choice(spots)
    move = rng.random() if reshape else 0.0
    if move < 0.6:
        parent[key] = rng.choice(ODD)
    elif move < 0.8 and isinstance(parent, dict):
        del parent[key]
    elif isinstance(parent, dict):
        parent[rng.choice(["extra", "zz", "a"])] = rng.choice(ODD)
    else:
        parent.append(rng.choice(ODD))
    return out
