"""The front door's connections: read deadlines and a ceiling (uvicorn's h11 protocol, tightened).

uvicorn bounds how long an *idle* keep-alive connection stays open
(``timeout_keep_alive``), but nothing bounds how long a client may take to
send a request: a connection that sends its headers one byte every few
seconds (slowloris), or a body at a trickle, holds a socket and a file
descriptor for as long as it likes, and ``limit_concurrency`` only answers
*complete* requests 503, it never closes anything. This protocol adds what
nginx calls ``client_header_timeout`` / ``client_body_timeout`` and
``worker_connections``:

- **header deadline**: from the moment a connection is open (or a response
  has ended on a kept-alive one) its next request's headers must be complete
  within ``header_timeout`` seconds, however the bytes trickle in; else the
  connection is answered ``408`` and closed.
- **body deadline**: from the end of the headers the whole body must arrive
  within ``body_timeout`` seconds (a total, not a gap between reads, so a
  trickle cannot stretch it); else ``408`` when no response has begun, and
  the connection is closed. The route reading the body sees a disconnect.
- **ceiling**: at most ``max_connections`` connections at once; one more is
  answered ``503`` with ``Retry-After`` and closed at once, so open sockets
  (and file descriptors) stay bounded whatever clients do.

Our own mechanism, not uvicorn's, because uvicorn (0.30 to 0.54) has no
header or body read deadline and its concurrency limit closes nothing; it is
a subclass of uvicorn's ``H11Protocol`` (passed as ``Config(http=...)``) that
watches h11's state after each read, so the parsing stays uvicorn's and h11's.
Bigger header blocks than h11's 16 KiB are refused 400 by h11 itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("aiworker.serve")

__all__ = ["deadline_protocol"]


def _raw_response(status: int, reason: str, code: str, message: str, extra: str = "") -> bytes:
    """A whole ``Connection: close`` answer in the front door's error shape, as bytes
    (written past h11, which cannot answer a request it has not parsed)."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode("ascii") + body


class _DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline, a body deadline and a ceiling."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 512

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "headers" | "body" | None (the app has the request)
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # `connections` holds the open ones; this one is not counted yet.
        if len(self.connections) >= self.max_connections:
            self._refused = True
            self.transport = cast(asyncio.Transport, transport)
            message = f"the front door holds its ceiling of {self.max_connections} connections"
            self.transport.write(
                _raw_response(
                    503, "Service Unavailable", "rate_limited", message, "retry-after: 1\r\n"
                )
            )
            self.transport.close()
            log.warning("refused a connection: %s", message)
            return
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._refused:
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        """Move the deadline with h11's view of the client's side of the exchange."""
        their = self.conn.their_state
        if their is h11.IDLE:
            if self._phase != "headers":
                self._arm("headers")  # a kept-alive connection's next request
        elif their is h11.SEND_BODY:
            if self._phase != "body":
                self._arm("body")
        elif self._phase is not None:
            self._disarm()  # the request is read: how long the answer takes is the app's

    def _arm(self, phase: str) -> None:
        self._disarm()
        self._phase = phase
        delay = self.header_timeout if phase == "headers" else self.body_timeout
        self._deadline = self.loop.call_later(delay, self._expired, phase)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = None

    def _expired(self, phase: str) -> None:
        self._deadline = None
        if self.transport is None or self.transport.is_closing():
            return
        answering = self.cycle is not None and not self.cycle.response_complete
        if phase == "headers" or (answering and not self.cycle.response_started):
            seconds = self.header_timeout if phase == "headers" else self.body_timeout
            message = f"the request's {phase} did not arrive within {seconds:g}s"
            self.transport.write(_raw_response(408, "Request Timeout", "timeout", message))
        # The route waiting on the body (if any) sees a disconnect.
        self.transport.close()


def deadline_protocol(
    header_timeout: float, body_timeout: float, max_connections: int
) -> type[asyncio.Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these bounds."""
    return type(
        "DeadlineProtocol",
        (_DeadlineProtocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
        },
    )
