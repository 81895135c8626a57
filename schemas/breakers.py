"""Models of the circuit breakers shared across worker processes."""

from __future__ import annotations

from aiworker.schemas.base import Model


class SharedBreakerState(Model):
    """One shared breaker: its key and the time (epoch seconds) until which it is open."""

    key: str
    open_until: float = 0.0
