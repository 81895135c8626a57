"""Circuit breakers per upstream target (a host, a model provider), in one
process and across processes.

Long on purpose: one capability, the in-process breaker and its shared view,
whose open/half-open/closed rules must be read together; its workflow is
``workflows/breakers.py``, its model ``schemas/breakers.py``.

1. :class:`BreakerRegistry`, the breakers of one process.

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

2. :class:`SharedBreakers`, the process side of breakers shared across processes.

   A :class:`BreakerRegistry` with a :class:`SharedBreakers` publishes each
   opening to the target's ``SharedBreakerWorkflow`` and, before letting a call
   through, consults what the other processes published, so one process's
   failures stop the others' calls too.

   Before a call (:meth:`SharedBreakers.refresh`), a view older than
   ``refresh_seconds`` is refreshed by one read of the workflow, awaited for at
   most ``wait_seconds``: a process that never asked about a target therefore
   fails fast on its very first call if another process opened it. A slow or
   unreachable Temporal never fails the call: after the bound the call goes on
   with the last known value (logged once per slow refresh). One refresh per key
   is in flight at a time; concurrent callers share it. A workflow that does not
   exist (the target was never opened) means "not open"; the time is read from
   the workflow's memo through ``DescribeWorkflow``, which the server answers
   itself, so no worker replays anything and a killed worker cannot stall it.
   Publishing never blocks a call: it runs as a background task.

3. One half-open probe across processes.

   When the shared open period ends, the target stays half-open for every
   process until a probe succeeds: before a call, a process that sees it
   half-open (or whose own breaker is half-open) asks the breaker workflow for
   the probe lease (:meth:`SharedBreakers.request_probe`, an update awaited at
   most ``wait_seconds``). The first asker gets it and its call is the probe;
   the others fail fast with ``circuit_open`` ("a probe is in flight") until
   the lease ends, as the open state does. The probe's success closes the
   breaker everywhere (signal ``closed``), its failure re-opens it; a prober
   killed mid-call frees the lease after ``open_seconds``. Within one process
   only one call asks at a time. A Temporal that does not answer in time
   leaves the decision to this process alone, as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryRejectedError,
)
from temporalio.common import AutoUpgradeVersioningOverride
from temporalio.service import RPCError, RPCStatusCode

from aiworker.activities.errors import CircuitOpenError
from aiworker.activities.metrics import BREAKER_STATES, WorkerMetrics
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.breakers import ProbeAnswer, ProbeRequest, SharedBreakerState

log = logging.getLogger("aiworker.breaker")

# How long one refresh read may take in the background, so that a hung
# Temporal does not pile up reads; callers wait far less (``wait_seconds``).
_QUERY_RPC_TIMEOUT = timedelta(seconds=5)


@dataclass(frozen=True)
class SharedView:
    """What the other processes said about one breaker key, as last refreshed:
    open until ``open_until`` (epoch seconds, 0: never opened), then half-open
    until a probe ``closed`` it; a probe lease runs until ``lease_until``."""

    open_until: float = 0.0
    closed: bool = True
    lease_until: float = 0.0

    def half_open(self, now: float) -> bool:
        return 0 < self.open_until <= now and not self.closed


class _Refresh:
    """One refresh read in flight for one key."""

    def __init__(self, task: asyncio.Task[None]) -> None:
        self.task = task
        # Set once a caller gave up waiting: later callers do not wait again.
        self.slow = False


class SharedBreakers:
    """Open-until times per breaker key, shared through Temporal.

    Args:
        queue: the pipelines task queue (with the deployment suffix) where the
            ``SharedBreakerWorkflow`` runs.
        client: the Temporal client; the running activity's by default.
        refresh_seconds: how old this process's view of a key may be before a
            call refreshes it.
        wait_seconds: how long a call waits for a refresh before it goes on
            with the last known value.
    """

    def __init__(
        self,
        queue: str,
        client: Client | None = None,
        refresh_seconds: float = 1.0,
        wait_seconds: float = 1.0,
    ) -> None:
        self.queue = queue
        self.refresh_seconds = refresh_seconds
        self.wait_seconds = wait_seconds
        self._client = client
        self._suffix = names.queue_suffix_of(queue)
        self._open_until: dict[str, float] = {}
        # (closed, lease_until) per key: the half-open probe's state
        self._probe: dict[str, tuple[bool, float]] = {}
        self._holder = f"{os.getpid()}@{socket.gethostname()}"
        self._refreshed: dict[str, float] = {}
        self._in_flight: dict[str, _Refresh] = {}
        self._failing: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    def _get_client(self) -> Client | None:
        if self._client is None and activity.in_activity():
            self._client = activity.client()
        return self._client

    def _spawn(self, coro: Any) -> asyncio.Task[Any] | None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()  # no loop (a synchronous caller): nothing to share now
            return None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _stale(self, key: str) -> bool:
        return time.monotonic() - self._refreshed.get(key, float("-inf")) >= self.refresh_seconds

    def _start_refresh(self, key: str) -> _Refresh | None:
        """The refresh in flight for ``key``, started now if there is none."""
        current = self._in_flight.get(key)
        if current is not None:
            return current
        # Stamped at the start: a failing Temporal is asked once per period, not per call.
        self._refreshed[key] = time.monotonic()
        task = self._spawn(self._refresh(key))
        if task is None:
            return None
        refresh = self._in_flight[key] = _Refresh(task)
        task.add_done_callback(lambda _: self._in_flight.pop(key, None))
        return refresh

    def open_until(self, key: str) -> float:
        """What the other processes said, as last refreshed (epoch seconds).

        Never waits: a stale view is refreshed in the background for later calls.
        """
        if self._stale(key):
            self._start_refresh(key)
        return self._open_until.get(key, 0.0)

    async def refresh(self, key: str) -> float:
        """Bring a stale view of ``key`` up to date, waiting at most ``wait_seconds``.

        Returns the open-until time (epoch seconds, 0: never opened) as known
        after the wait.
        """
        refresh = self._in_flight.get(key)
        if refresh is None and self._stale(key):
            refresh = self._start_refresh(key)
        if refresh is not None and not refresh.slow:
            try:
                await asyncio.wait_for(asyncio.shield(refresh.task), self.wait_seconds)
            except TimeoutError:
                if not refresh.slow:
                    refresh.slow = True
                    log.warning(
                        "breaker.refresh_slow",
                        extra={
                            "aiworker": {
                                "event": "breaker_refresh_slow",
                                "key": key,
                                "waited_seconds": self.wait_seconds,
                            }
                        },
                    )
        return self._open_until.get(key, 0.0)

    def view(self, key: str) -> SharedView:
        """What the other processes said about ``key``, as last refreshed (never waits)."""
        closed, lease_until = self._probe.get(key, (True, 0.0))
        return SharedView(self._open_until.get(key, 0.0), closed, lease_until)

    def publish(self, key: str, open_until: float) -> None:
        """Tell every process that ``key`` is open until ``open_until``."""
        self._open_until[key] = max(self._open_until.get(key, 0.0), open_until)
        self._probe[key] = (False, 0.0)
        self._spawn(self._publish(key, open_until))

    def publish_closed(self, key: str) -> None:
        """Tell every process that the probe of ``key`` succeeded."""
        self._probe[key] = (True, 0.0)
        self._spawn(self._publish_closed(key))

    async def request_probe(self, key: str, lease_seconds: float) -> ProbeAnswer | None:
        """Ask the breaker workflow for the one half-open probe of ``key``.

        Returns its answer, or None when Temporal did not answer within
        ``wait_seconds`` (or failed): the caller then decides alone.
        """
        client = self._get_client()
        if client is None:
            return None
        handle = client.get_workflow_handle(names.shared_breaker_workflow_id(key, self._suffix))
        try:
            answer: ProbeAnswer = await asyncio.wait_for(
                handle.execute_update(
                    names.BREAKER_PROBE_UPDATE,
                    ProbeRequest(holder=self._holder, lease_seconds=lease_seconds),
                    result_type=ProbeAnswer,
                    rpc_timeout=_QUERY_RPC_TIMEOUT,
                ),
                self.wait_seconds,
            )
        except Exception as e:
            log.warning(
                "breaker.probe_unanswered",
                extra={
                    "aiworker": {
                        "event": "breaker_probe_unanswered",
                        "key": key,
                        "error": f"{type(e).__name__}: {e}"[:300],
                    }
                },
            )
            return None
        self._open_until[key] = max(self._open_until.get(key, 0.0), answer.open_until)
        self._probe[key] = (answer.closed, answer.lease_until)
        return answer

    async def _refresh(self, key: str) -> None:
        client = self._get_client()
        if client is None:
            return
        handle = client.get_workflow_handle(names.shared_breaker_workflow_id(key, self._suffix))
        try:
            view = await self._read(handle)
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                self._refresh_failed(key, e)
                return
            view = SharedView()  # never opened anywhere
        except Exception as e:
            self._refresh_failed(key, e)
            return
        self._failing.discard(key)
        self._open_until[key] = max(self._open_until.get(key, 0.0), view.open_until)
        if view.open_until >= self._open_until[key]:
            self._probe[key] = (view.closed, view.lease_until)

    @staticmethod
    async def _read(handle: WorkflowHandle[Any, Any]) -> SharedView:
        """The breaker's state, from the memo the server keeps (no worker involved);
        a breaker workflow started before it kept one is queried instead. A
        workflow that is no longer running (idle long after its last opening) is
        closed."""
        desc = await handle.describe(rpc_timeout=_QUERY_RPC_TIMEOUT)
        running = desc.status == WorkflowExecutionStatus.RUNNING
        until = await desc.memo_value(names.BREAKER_MEMO_KEY, None, type_hint=float)
        probe = await desc.memo_value(names.BREAKER_PROBE_MEMO_KEY, None)
        closed, lease_until = not running, 0.0
        if running and isinstance(probe, dict):
            closed = bool(probe.get("closed", False))
            lease_until = float(probe.get("lease_until") or 0.0)
        if until is not None:
            return SharedView(float(until), closed, lease_until)
        if not running:
            return SharedView()
        try:
            until = await handle.query(
                names.BREAKER_STATE_QUERY, result_type=float, rpc_timeout=_QUERY_RPC_TIMEOUT
            )
        except WorkflowQueryRejectedError:
            return SharedView()
        return SharedView(float(until), closed, lease_until)

    def _refresh_failed(self, key: str, e: Exception) -> None:
        if key in self._failing:
            return  # logged when it started failing; calls go on with the last known value
        self._failing.add(key)
        log.warning(
            "breaker.refresh_failed",
            extra={
                "aiworker": {"event": "breaker_refresh_failed", "key": key, "error": str(e)[:300]}
            },
        )

    async def _publish_closed(self, key: str) -> None:
        client = self._get_client()
        if client is None:
            return
        handle = client.get_workflow_handle(names.shared_breaker_workflow_id(key, self._suffix))
        try:
            await handle.signal(names.BREAKER_CLOSED_SIGNAL, rpc_timeout=_QUERY_RPC_TIMEOUT)
        except Exception as e:
            log.warning(
                "breaker.share_failed",
                extra={"aiworker": {"event": "breaker_share_failed", "key": key, "error": str(e)}},
            )

    async def _publish(self, key: str, open_until: float) -> None:
        client = self._get_client()
        if client is None:
            return
        try:
            await client.start_workflow(
                names.SHARED_BREAKER_WORKFLOW,
                SharedBreakerState(key=key, open_until=open_until),
                id=names.shared_breaker_workflow_id(key, self._suffix),
                task_queue=self.queue,
                start_signal=names.BREAKER_OPENED_SIGNAL,
                start_signal_args=[open_until],
                static_summary=f"breaker {key}",
                # Long-lived: on a versioned worker it follows the current build (pipelines
                # are pinned); unversioned workers ignore it (workers/process/deployments.py).
                versioning_override=AutoUpgradeVersioningOverride(),
            )
        except Exception as e:
            log.warning(
                "breaker.share_failed",
                extra={"aiworker": {"event": "breaker_share_failed", "key": key, "error": str(e)}},
            )


@dataclass
class _Circuit:
    failures: deque[float] = field(default_factory=deque)
    state: str = "closed"
    opened_at: float = 0.0
    probe_in_flight: bool = False
    # when the probe in flight started (clock); one that never reports ends after open_seconds
    probe_started: float = 0.0
    # the probe in flight holds the shared lease: its outcome is told to every process
    shared_probe: bool = False


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
        # the one ask for the shared probe in flight per target; other calls share it
        self._asks: dict[str, asyncio.Future[ProbeAnswer | None]] = {}

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
        """:meth:`check`, after refreshing a stale view of what other processes opened,
        and with one half-open probe across processes (module docstring, 3).

        A locally open breaker fails fast without asking Temporal. The refresh
        and the probe lease each wait at most ``shared.wait_seconds``; a slow
        Temporal lets the call go on with this process's own state instead of
        failing it.
        """
        shared = self.shared
        if shared is None:
            self.check(target)
            return
        key = f"{self.kind}:{target}"
        with self._lock:
            c = self._circuits.setdefault(target, _Circuit())
            self._advance(target, c)
            local = c.state
            if local == "open":
                raise self._open_error(target, c)
        await shared.refresh(key)
        view = shared.view(key)
        now = time.time()
        if view.open_until > now:  # (re-)opened by another process
            raise self._shared_open_error(target, view.open_until - now)
        if not (local == "half_open" or view.half_open(now)):
            self.check(target)  # closed everywhere
            return
        # The workflow decides, not this process's view of the lease: a view up to
        # ``refresh_seconds`` old may miss that the probe already closed the breaker.
        ask = self._asks.get(target)
        if ask is not None:  # another call of this process asks now: share its answer
            answer = await asyncio.shield(ask)
            now = time.time()
            if answer is None:
                self.check(target)
            elif answer.open_until > now:
                raise self._shared_open_error(target, answer.open_until - now)
            elif not answer.closed:
                raise self._probe_elsewhere(target, answer.lease_until - now, answer.granted)
            return
        self._reserve_probe(target)  # raises while this process's probe is in flight
        ask = asyncio.ensure_future(shared.request_probe(key, self.open_seconds))
        self._asks[target] = ask
        try:
            answer = await asyncio.shield(ask)
        except BaseException:
            self._end_reservation(target)
            raise
        finally:
            self._asks.pop(target, None)
        if answer is None:  # Temporal did not answer: this process decides alone
            self._end_reservation(target)
            self.check(target)
            return
        if answer.granted:
            self._grant_probe(target)
            return
        self._end_reservation(target, closed=answer.closed)
        if answer.closed:
            return
        now = time.time()
        if answer.open_until > now:  # re-opened meanwhile
            raise self._shared_open_error(target, answer.open_until - now)
        raise self._probe_elsewhere(target, answer.lease_until - now)

    def _probe_elsewhere(self, target: str, wait: float, here: bool = False) -> CircuitOpenError:
        wait = max(0.1, wait)
        where = (
            "its probe is in flight"
            if here
            else ("a probe is in flight from another worker process")
        )
        return CircuitOpenError(
            f"circuit for {self.kind} {target} is half-open and {where}; "
            f"next probe in {wait:.1f}s at the latest",
            retry_after=round(wait, 3),
            target=target,
            shared=not here,
        )

    def _reserve_probe(self, target: str) -> None:
        """This process's one ask for the shared probe, or ``CircuitOpenError``
        while another call of this process asks or probes."""
        with self._lock:
            c = self._circuits.setdefault(target, _Circuit())
            self._advance(target, c)
            if c.probe_in_flight and self.clock() < c.probe_started + self.open_seconds:
                wait = max(0.1, c.probe_started + self.open_seconds - self.clock())
                raise CircuitOpenError(
                    f"circuit for {self.kind} {target} is half-open and its probe is in "
                    f"flight; next probe in {wait:.1f}s at the latest",
                    retry_after=round(wait, 3),
                    target=target,
                )
            c.probe_in_flight = True
            c.probe_started = self.clock()

    def _end_reservation(self, target: str, closed: bool = False) -> None:
        """The ask ended without the probe; ``closed``: another process's probe closed it."""
        with self._lock:
            c = self._circuits.setdefault(target, _Circuit())
            c.probe_in_flight = False
            if closed and c.state != "closed":
                c.failures.clear()
                self._transition(target, c, "closed")

    def _grant_probe(self, target: str) -> None:
        """This call is the probe across processes: half-open here too."""
        with self._lock:
            c = self._circuits.setdefault(target, _Circuit())
            c.probe_in_flight = True
            c.probe_started = self.clock()
            c.shared_probe = True
            if c.state != "half_open":
                c.opened_at = self.clock() - self.open_seconds
                self._transition(target, c, "half_open")

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
            if c.state == "half_open" and (
                not c.probe_in_flight or self.clock() >= c.probe_started + self.open_seconds
            ):
                # a probe that never reported (its call was cancelled) frees the next one
                c.probe_in_flight = True
                c.probe_started = self.clock()
                return
            raise self._open_error(target, c)

    def _open_error(self, target: str, c: _Circuit) -> CircuitOpenError:
        wait = max(0.1, c.opened_at + self.open_seconds - self.clock())
        return CircuitOpenError(
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
            raise self._shared_open_error(target, wait)

    def _shared_open_error(self, target: str, wait: float) -> CircuitOpenError:
        return CircuitOpenError(
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
            if c.shared_probe and self.shared is not None:
                self.shared.publish_closed(f"{self.kind}:{target}")
            c.shared_probe = False
            if c.state != "closed":
                self._transition(target, c, "closed")

    def record_failure(self, target: str) -> None:
        with self._lock:
            c = self._circuits.setdefault(target, _Circuit())
            now = self.clock()
            if c.state == "half_open":
                c.probe_in_flight = False
                c.shared_probe = False
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
