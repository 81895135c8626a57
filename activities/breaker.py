"""Circuit breakers per upstream target (a host, a model provider).

Closed: calls pass; failures are counted in a sliding window. When
``failure_threshold`` failures fall within ``window_seconds`` the breaker
opens: calls fail fast with ``circuit_open`` and a retry delay until
``open_seconds`` have passed. Then it is half-open: one probe call passes; its
success closes the breaker, its failure opens it again. State is exported as
the ``aiworker_breaker_state`` gauge and logged on every transition.

One :class:`BreakerRegistry` per process is shared by every activity. With a
:class:`SharedBreakers` it also fails fast while another process has the
target open: async callers use :meth:`BreakerRegistry.acheck`, which first
brings this process's view of the shared state up to date (briefly bounded).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from aiworker.activities.errors import CircuitOpenError
from aiworker.activities.metrics import BREAKER_STATES, WorkerMetrics
from aiworker.activities.shared_breaker import SharedBreakers
from aiworker.schemas.settings import Settings

log = logging.getLogger("aiworker.breaker")


@dataclass
class _Circuit:
    failures: deque[float] = field(default_factory=deque)
    state: str = "closed"
    opened_at: float = 0.0
    probe_in_flight: bool = False


class BreakerRegistry:
    """Breakers of one kind (``host`` or ``provider``), keyed by target."""

    def __init__(
        self,
        kind: str,
        *,
        failure_threshold: int = 5,
        window_seconds: float = 60.0,
        open_seconds: float = 30.0,
        metrics: WorkerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedBreakers | None = None,
    ) -> None:
        self.kind = kind
        self.failure_threshold = failure_threshold
        self.window_seconds = window_seconds
        self.open_seconds = open_seconds
        self.metrics = metrics
        self.clock = clock
        self.shared = shared
        self._circuits: dict[str, _Circuit] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(
        cls,
        kind: str,
        settings: Settings,
        *,
        metrics: WorkerMetrics | None = None,
        shared: SharedBreakers | None = None,
    ) -> BreakerRegistry:
        """Breakers of ``kind`` tuned by the ``AIWORKER_BREAKER_*`` settings."""
        return cls(
            kind,
            failure_threshold=settings.breaker_failure_threshold,
            window_seconds=settings.breaker_window_seconds,
            open_seconds=settings.breaker_open_seconds,
            metrics=metrics,
            shared=shared,
        )

    def state(self, target: str) -> str:
        """``closed``, ``open`` or ``half_open`` as of now."""
        with self._lock:
            c = self._circuits.get(target)
            if c is None:
                return "closed"
            self._advance(target, c)
            return c.state

    async def acheck(self, target: str) -> None:
        """:meth:`check`, after refreshing a stale view of what other processes opened.

        A locally open breaker fails fast without asking Temporal. The refresh
        waits at most ``shared.wait_seconds``; a slow Temporal lets the call
        go on with the last known state instead of failing it.
        """
        if self.shared is not None and self.state(target) == "closed":
            await self.shared.refresh(f"{self.kind}:{target}")
        self.check(target)

    def check(self, target: str) -> None:
        """Let a call through, or raise ``CircuitOpenError`` with the wait.

        The shared state is read as last refreshed, never waited for (a stale
        view is refreshed in the background): async callers use :meth:`acheck`.
        """
        with self._lock:
            c = self._circuits.setdefault(target, _Circuit())
            self._advance(target, c)
            if c.state == "closed":
                self._check_shared(target)
                return
            if c.state == "half_open" and not c.probe_in_flight:
                c.probe_in_flight = True
                return
            wait = max(0.1, c.opened_at + self.open_seconds - self.clock())
            raise CircuitOpenError(
                f"circuit for {self.kind} {target} is open; next probe in {wait:.1f}s",
                retry_after=round(wait, 3),
                target=target,
            )

    def _check_shared(self, target: str) -> None:
        """Fail fast while another process has this target's breaker open."""
        if self.shared is None:
            return
        until = self.shared.open_until(f"{self.kind}:{target}")
        wait = until - time.time()
        if wait > 0:
            raise CircuitOpenError(
                f"circuit for {self.kind} {target} is open (opened by another worker "
                f"process); next probe in {wait:.1f}s",
                retry_after=round(max(0.1, wait), 3),
                target=target,
                shared=True,
            )

    def record_success(self, target: str) -> None:
        with self._lock:
            c = self._circuits.setdefault(target, _Circuit())
            c.failures.clear()
            c.probe_in_flight = False
            if c.state != "closed":
                self._transition(target, c, "closed")

    def record_failure(self, target: str) -> None:
        with self._lock:
            c = self._circuits.setdefault(target, _Circuit())
            now = self.clock()
            if c.state == "half_open":
                c.probe_in_flight = False
                c.opened_at = now
                self._transition(target, c, "open")
                return
            c.failures.append(now)
            while c.failures and c.failures[0] < now - self.window_seconds:
                c.failures.popleft()
            if c.state == "closed" and len(c.failures) >= self.failure_threshold:
                c.opened_at = now
                self._transition(target, c, "open")

    def _advance(self, target: str, c: _Circuit) -> None:
        if c.state == "open" and self.clock() >= c.opened_at + self.open_seconds:
            c.probe_in_flight = False
            self._transition(target, c, "half_open")

    def _transition(self, target: str, c: _Circuit, state: str) -> None:
        previous, c.state = c.state, state
        log.warning(
            "breaker.%s",
            state,
            extra={
                "aiworker": {
                    "event": "breaker_state",
                    "kind": self.kind,
                    "target": target,
                    "from": previous,
                    "to": state,
                }
            },
        )
        if self.metrics is not None:
            self.metrics.breaker_state.labels(self.kind, target).set(BREAKER_STATES[state])
        if state == "open" and self.shared is not None:
            self.shared.publish(f"{self.kind}:{target}", time.time() + self.open_seconds)
