"""Models of the circuit breakers shared across worker processes."""

from __future__ import annotations

from aiworker.schemas.base import Model


class SharedBreakerState(Model):
    """One shared breaker: its key, the time (epoch seconds) until which it is open,
    whether a probe closed it since (``closed``) and until when the one probe lease
    runs (``lease_until``, epoch seconds; 0: none granted)."""

    key: str
    open_until: float = 0.0
    closed: bool = False
    lease_until: float = 0.0


class ProbeAnswer(Model):
    """The breaker workflow's answer to a process that asks for the half-open probe.

    ``granted``: this process's call is the one probe, until ``lease_until`` at the
    latest. ``closed``: a probe already succeeded, calls pass. Otherwise the target
    is still open (``open_until`` in the future) or another process holds the lease
    (until ``lease_until``).
    """

    granted: bool = False
    closed: bool = False
    open_until: float = 0.0
    lease_until: float = 0.0


class ProbeRequest(Model):
    """A process asking for the half-open probe lease: who asks (``holder``, for
    logs) and how long the lease runs at most (``lease_seconds``: its breaker's open
    period, so a prober that dies frees the probe after one more period)."""

    holder: str = ""
    lease_seconds: float = 30.0
