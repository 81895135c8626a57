"""Reading a server's wait hints into one retry delay.

One reader for every HTTP client in the workers: the scrape fetch and the
publish webhook read ``Retry-After`` (:func:`parse_retry_after`); model
providers add their own headers (``retry-after-ms``, OpenAI and Anthropic
reset headers), read by :func:`retry_after`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

# A provider asking for more than this is more likely wrong than right; the
# pipeline's deadline and Temporal's backoff take over from there.
MAX_RETRY_AFTER_SECONDS = 900.0

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_RESET_KINDS = ("requests", "tokens", "input-tokens", "output-tokens")


def parse_duration(text: str) -> float | None:
    """``"6m0s"``, ``"1.5s"``, ``"20ms"``, ``"2"`` -> seconds; None if not a duration."""
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


def _seconds_until(text: str, now: float) -> float | None:
    text = text.strip()
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            at = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return max(0.0, at.timestamp() - now)


def _reset(value: str, now: float) -> float | None:
    d = parse_duration(value)
    if d is not None:
        # A bare number this large is an epoch timestamp, not a duration.
        return max(0.0, d - now) if d > 1e9 else d
    return _seconds_until(value, now)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta seconds or an HTTP date).

    Args:
        value: the header's value, or None when it is absent.
        now: the current epoch time (for tests); the clock when None.

    Returns:
        The wait in seconds, capped at ``MAX_RETRY_AFTER_SECONDS``, or None when
        the value names no wait.
    """
    if not value:
        return None
    v = value.strip()
    try:
        wait: float | None = max(0.0, float(v))
    except ValueError:
        wait = _seconds_until(v, time.time() if now is None else now)
    return None if wait is None else round(min(wait, MAX_RETRY_AFTER_SECONDS), 3)


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The wait a 429 (or 503) asks for, in seconds, or None if it names none.

    In order: ``retry-after-ms``; ``Retry-After`` (seconds or an HTTP date);
    the reset headers of the exhausted limit (OpenAI ``x-ratelimit-reset-*``
    durations, Anthropic ``anthropic-ratelimit-*-reset`` timestamps), or the
    longest reset when none says which limit ran out.
    """
    now = time.time() if now is None else now
    h = {k.lower(): v for k, v in headers.items()}
    wait: float | None = None
    if "retry-after-ms" in h:
        try:
            wait = max(0.0, float(h["retry-after-ms"]) / 1000)
        except ValueError:
            wait = None
    if wait is None and "retry-after" in h:
        wait = parse_retry_after(h["retry-after"], now)
    if wait is None:
        exhausted: list[float] = []
        others: list[float] = []
        for kind in _RESET_KINDS:
            for reset_key, remaining_key in (
                (f"x-ratelimit-reset-{kind}", f"x-ratelimit-remaining-{kind}"),
                (f"anthropic-ratelimit-{kind}-reset", f"anthropic-ratelimit-{kind}-remaining"),
            ):
                if reset_key not in h:
                    continue
                r = _reset(h[reset_key], now)
                if r is None:
                    continue
                (exhausted if h.get(remaining_key, "").strip() == "0" else others).append(r)
        if exhausted or others:
            wait = max(exhausted or others)
    if wait is None:
        return None
    return round(min(wait, MAX_RETRY_AFTER_SECONDS), 3)
