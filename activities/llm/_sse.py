"""Server-sent events (the WHATWG event-stream format) from a bounded body.

No SSE library here: ``httpx-sse`` reads through httpx's own line iterator,
which has no line limit and decodes ``Content-Encoding`` without an output
limit; this is the few lines of the format the model providers use, fed by
:func:`aiworker.activities.bodies.iter_body` (which bounds the total).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from aiworker.activities.errors import UpstreamError

# One SSE line or event: a chunk of one token is ~300 bytes; a tool call's
# arguments come in many small deltas, never as one huge event.
MAX_EVENT_BYTES = 256 * 1024


@dataclass
class Event:
    """One server-sent event: its ``event`` name ('' when unnamed) and ``data``."""

    name: str
    data: str


async def events(
    pieces: AsyncIterator[bytes], limit: int = MAX_EVENT_BYTES
) -> AsyncGenerator[Event, None]:
    """The events of an event stream from its decoded body ``pieces``.

    Lines end at CR, LF or CRLF; ``data`` lines join with LF; comments
    (``:``) and ``id``/``retry`` are skipped. An event still open when the
    body ends is handed out too (a server may omit the last blank line).
    """
    buf = carry = b""
    name, size = "", 0
    data: list[str] = []

    def line_of(raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UpstreamError("an event-stream line is not UTF-8") from None

    async for piece in pieces:
        piece, carry = carry + piece, b""
        if piece.endswith(b"\r"):  # it may be the first half of a CRLF split across pieces
            piece, carry = piece[:-1], b"\r"
        buf += piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, buf = buf.split(b"\n")
        if len(buf) > limit:
            raise UpstreamError(f"an event-stream line is over {limit} bytes")
        for raw in lines:
            if not raw:
                if data:
                    yield Event(name, "\n".join(data))
                name, data, size = "", [], 0
                continue
            field, _, value = line_of(raw).partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                size += len(raw)
                if size > limit:
                    raise UpstreamError(f"an event-stream event is over {limit} bytes")
                data.append(value)
    if buf:
        field, _, value = line_of(buf).partition(":")
        if field == "data":
            data.append(value.removeprefix(" "))
    if data:
        yield Event(name, "\n".join(data))
