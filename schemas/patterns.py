"""User regular expressions, on RE2: linear time, whatever the pattern and text.

Python's ``re`` backtracks: ``^(a+)+$`` against 29 ``a``s and a ``b`` takes
seconds, and a workflow task or an activity's event loop stalls while it runs.
Every pattern a user gives (an extraction ``regex``, a JSON Schema ``pattern``
or ``patternProperties`` name, a string checked as ``format: regex``) is
compiled here with google-re2, whose matching time is linear in the text. RE2
has no backreferences and no lookaround; a pattern that needs them (or that
RE2 refuses for another reason, such as its size) raises :class:`PatternError`,
which callers report as ``invalid_input`` naming the field.

No I/O; the workflow sandbox passes this module (and ``re2``, a C extension)
through.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import re2

# What a refused pattern's message says about the engine, everywhere.
ENGINE = "aiworker runs patterns on RE2 (linear time, no backreferences or lookaround)"


MAX_MEM = 1024 * 1024
"""RE2's memory limit per pattern (program and matching cache)."""


class PatternError(ValueError):
    """A pattern RE2 does not compile; the message says why, naming the engine."""


def _options() -> re2.Options:
    options = re2.Options()
    # RE2 logs every refused pattern to stderr by default; the refusal is
    # reported to the caller instead.
    options.log_errors = False
    # RE2's compile time grows with the program it builds, up to this memory
    # limit: at its default (8 MiB) one 16-character pattern (a Unicode class
    # repeated) took 140-300 ms, so a dozen held a workflow task past the SDK's
    # deadlock detector. At 1 MiB the worst pattern compiles (or is refused as
    # too large) in about 40 ms, which the caps on patterns per pipeline
    # (schemas/caps.py) turn into a bound.
    options.max_mem = MAX_MEM
    return options


_OPTIONS = _options()


# RE2 bounds each compiled pattern's memory (8 MiB by default, mostly its DFA
# cache, filled only as texts need it); the cache bounds how many are kept.
@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (cached); :class:`PatternError` if RE2 refuses it."""
    if not isinstance(pattern, str):
        raise PatternError(f"{type(pattern).__name__} is not a string")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as e:
        why = e.args[0] if e.args else ""
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise PatternError(f"{json.dumps(pattern)} is not supported: {ENGINE}: {why}") from None
    except UnicodeEncodeError:
        raise PatternError(
            f"{json.dumps(pattern)} is not supported: it is not valid Unicode"
        ) from None


def search(regex: Any, text: str) -> Any:
    """RE2's unanchored search of ``text`` (JSON Schema's ``pattern`` semantics).

    A text with lone surrogates (which JSON allows, UTF-8 does not) is searched
    as its ``surrogatepass`` bytes; groups of such a match are bytes.
    """
    try:
        return regex.search(text)
    except UnicodeEncodeError:
        return regex.search(text.encode("utf-8", "surrogatepass"))


def first_group(regex: Any, text: str) -> str | None:
    """The first capture group of ``regex`` in ``text`` (the whole match if it has
    none), or None when it does not match."""
    m = search(regex, text)
    if m is None:
        return None
    found = m.group(1) if regex.groups else m.group(0)
    if isinstance(found, bytes):
        return found.decode("utf-8", "surrogatepass")
    return found if found is not None else ""


__all__ = ["ENGINE", "MAX_MEM", "PatternError", "compile_pattern", "first_group", "search"]
