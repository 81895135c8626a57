"""A client-side limit per provider endpoint: requests and tokens per minute.

Every call in the process reserves one request and its estimated tokens
(prompt estimate + ``max_tokens``) in a sliding 60-second window before it
goes out; when the provider reports the real usage the reservation is
corrected. A call that would pass either limit is refused at once with
``rate_limited`` and the time until enough of the window has expired as its
retry delay, so Temporal waits instead of a coroutine holding a slot. A call
that alone needs more tokens than the per-minute limit can never pass and is
``budget_exceeded``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from aiworker.activities.errors import BudgetExceededError, RateLimitedError

WINDOW_SECONDS = 60.0


@dataclass(eq=False)
class _Entry:
    at: float
    tokens: int


@dataclass
class _Window:
    entries: deque[_Entry] = field(default_factory=deque)
    tokens: int = 0


class Reservation:
    """One admitted call; :meth:`settle` replaces its estimate by real usage."""

    def __init__(self, limiter: RateLimiter, window: _Window | None, entry: _Entry | None) -> None:
        self._limiter = limiter
        self._window = window
        self._entry = entry

    def release(self) -> None:
        """Give the reservation back: the call never went out."""
        if self._window is None or self._entry is None:
            return
        with self._limiter._lock:
            if self._entry in self._window.entries:
                self._window.entries.remove(self._entry)
                self._window.tokens -= self._entry.tokens
        self._entry = None

    def settle(self, tokens: int) -> None:
        if self._window is None or self._entry is None:
            return
        with self._limiter._lock:
            if self._entry in self._window.entries:
                self._window.tokens += tokens - self._entry.tokens
            self._entry.tokens = tokens


class RateLimiter:
    """Sliding-window limits keyed by target; one per process, thread-safe."""

    def __init__(
        self,
        limits: dict[str, tuple[int | None, int | None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.clock = clock
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def acquire(self, target: str, tokens: int) -> Reservation:
        """Admit one call of about ``tokens`` tokens or raise ``RateLimitedError``."""
        rpm, tpm = self.limits.get(target, (None, None))
        if rpm is None and tpm is None:
            return Reservation(self, None, None)
        if tpm is not None and tokens > tpm:
            raise BudgetExceededError(
                f"the call needs about {tokens} tokens; the client-side limit of {target} "
                f"is {tpm} tokens/min",
                resource="tokens_per_minute",
                limit=tpm,
                target=target,
            )
        with self._lock:
            now = self.clock()
            w = self._windows.setdefault(target, _Window())
            while w.entries and w.entries[0].at <= now - WINDOW_SECONDS:
                w.tokens -= w.entries.popleft().tokens
            wait = 0.0
            if rpm is not None and len(w.entries) + 1 > rpm:
                wait = w.entries[len(w.entries) - rpm].at + WINDOW_SECONDS - now
            if tpm is not None and w.tokens + tokens > tpm:
                # Wait until enough of the oldest reservations have left the window.
                freed = 0
                for e in w.entries:
                    freed += e.tokens
                    if w.tokens - freed + tokens <= tpm:
                        wait = max(wait, e.at + WINDOW_SECONDS - now)
                        break
            if wait > 0:
                which = "requests" if rpm is not None and len(w.entries) + 1 > rpm else "tokens"
                raise RateLimitedError(
                    f"client-side {which}/min limit of {target} reached; retry in {wait:.1f}s",
                    retry_after=round(max(wait, 0.1), 3),
                    target=target,
                    limit=rpm if which == "requests" else tpm,
                )
            entry = _Entry(now, tokens)
            w.entries.append(entry)
            w.tokens += tokens
            return Reservation(self, w, entry)
