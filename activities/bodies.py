"""Bounded reads of HTTP response bodies: every body the project reads comes through here.

httpx (the model providers' client) and aiohttp (the fetch tool's and the
webhook poster's) decode ``Content-Encoding`` themselves, one network chunk at
a time and with no output limit, so an 850-byte brotli body expands to 1 GiB
inside a single decode call before any size check can run. :func:`read_body`
therefore reads the raw stream (httpx's ``aiter_raw``; aiohttp's content with
``auto_decompress=False``) and decodes it here
with decompressors that take an output limit: zlib's ``max_length`` with
``unconsumed_tail`` (gzip, deflate zlib-wrapped or raw) and brotli's
``output_buffer_limit``. Output comes in pieces of at most :data:`CHUNK`
bytes, produced lazily, and reading stops at the first piece that passes the
cap, so a decoder never produces more than the cap plus one piece, whatever
the body. Neither httpx, aiohttp nor another well-kept library offers a
bounded streaming decoder, hence this module.

Refused before decoding (:class:`UnsupportedEncodingError`): more than one
coding (``gzip, gzip`` multiplies the expansion ratio) and codings other than
``gzip``/``x-gzip``, ``deflate``, ``br`` and ``identity`` (no zstd: no zstd
library is installed, and what is not advertised is not accepted).

Errors (plain exceptions: each caller maps them to its own stable codes)::

    BodyError
    ├── BodyTooLargeError         the body passed the cap
    ├── UnsupportedEncodingError  stacked or unknown Content-Encoding
    └── CorruptBodyError          not valid for its encoding, or cut short
"""

from __future__ import annotations

import contextlib
import importlib.util
import zlib
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

import httpx

if TYPE_CHECKING:
    import aiohttp

# A streamed response of either client: httpx's (model providers) or aiohttp's (fetches
# and webhooks); told apart by type at run time, so this module never imports aiohttp.
Response: TypeAlias = "httpx.Response | aiohttp.ClientResponse"

# The largest piece a decoder hands out at once: the overshoot bound past any cap.
CHUNK = 64 * 1024
# brotli 1.2 grows its output buffer in blocks of about 32 KiB and stops growing once
# the limit is reached, so a limit below one block yields one block (32752 bytes) per call.
_BROTLI_LIMIT = 16 * 1024
# brotli comes with the 'scrape' extra: without it (a core install) bodies are not
# asked for in brotli, and a brotli body is refused as an unsupported encoding.
_HAVE_BROTLI = importlib.util.find_spec("brotli") is not None
# What this module decodes, for ``Accept-Encoding``.
ACCEPT_ENCODING = "gzip, deflate, br" if _HAVE_BROTLI else "gzip, deflate"


class BodyError(Exception):
    """A body that could not be read within its bounds."""

    reason = "body"


class BodyTooLargeError(BodyError):
    """The body (decoded, or as declared by ``Content-Length``) passed the cap."""

    reason = "too_large"

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class UnsupportedEncodingError(BodyError):
    """A ``Content-Encoding`` this module does not decode: stacked or unknown."""

    def __init__(self, message: str, *, encoding: str, reason: str) -> None:
        super().__init__(message)
        self.encoding = encoding
        self.reason = reason


class CorruptBodyError(BodyError):
    """Bytes that are not valid for their encoding, or a compressed stream cut short."""

    reason = "corrupt"


@dataclass
class BodyMeter:
    """What the reads it watches received and produced, in bytes.

    Attributes:
        reads: reads watched.
        raw_bytes: bytes received from the network, all reads.
        decoded_bytes: bytes the decoders produced, all reads.
        largest_read: the most bytes one read's decoder produced.
        largest_overshoot: the most one read's decoder produced past its cap
            (negative while every read stayed under its cap).
    """

    reads: int = 0
    raw_bytes: int = 0
    decoded_bytes: int = 0
    largest_read: int = 0
    largest_overshoot: int = -(1 << 62)

    def _read(self, cap: int, raw: int, decoded: int) -> None:
        self.reads += 1
        self.raw_bytes += raw
        self.decoded_bytes += decoded
        self.largest_read = max(self.largest_read, decoded)
        self.largest_overshoot = max(self.largest_overshoot, decoded - cap)


class _Decoder(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]: ...

    def finish(self) -> None: ...


class _Identity:
    def feed(self, data: bytes) -> Iterator[bytes]:
        for i in range(0, len(data), CHUNK):
            yield data[i : i + CHUNK]

    def finish(self) -> None:
        pass


def _zlib_header(head: bytes) -> bool:
    """Whether ``head`` starts a zlib stream (RFC 1950: deflate method, checksum of 31)."""
    return head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0


class _Zlib:
    """gzip (``wbits`` 31), or deflate with or without its zlib wrapper (sniffed)."""

    def __init__(self, wbits: int | None) -> None:
        self._d = None if wbits is None else zlib.decompressobj(wbits)
        self._head = b""

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._d is None:
            # "deflate" is zlib-wrapped by the RFC and raw in practice (old IIS): the
            # first two bytes tell which, and may arrive in separate chunks.
            self._head += data
            if len(self._head) < 2:
                return
            data, self._head = self._head, b""
            self._d = zlib.decompressobj(zlib.MAX_WBITS if _zlib_header(data) else -zlib.MAX_WBITS)
        d = self._d
        try:
            while data and not d.eof:
                out = d.decompress(data, CHUNK)
                data = d.unconsumed_tail
                if out:
                    yield out
        except zlib.error as e:
            raise CorruptBodyError(f"not valid compressed data: {e}") from None

    def finish(self) -> None:
        if self._head or (self._d is not None and not self._d.eof):
            raise CorruptBodyError("the compressed body ends before its stream does")


class _Brotli:
    def __init__(self) -> None:
        import brotli

        self._brotli = brotli
        self._d = brotli.Decompressor()

    def feed(self, data: bytes) -> Iterator[bytes]:
        d = self._d
        if d.is_finished():
            return  # bytes after the end of the stream are ignored, as zlib does
        try:
            out = d.process(data, output_buffer_limit=_BROTLI_LIMIT)
            # Input the limit held back stays inside the decoder: drain it with empty
            # input until a call produces nothing, which means it needs more input.
            # Every turn yields output, so the reader's cap ends the loop.
            while out:
                yield out
                if d.is_finished():
                    return
                out = d.process(b"", output_buffer_limit=_BROTLI_LIMIT)
            if not d.can_accept_more_data():
                raise CorruptBodyError("the brotli decoder stopped making progress")
        except self._brotli.error as e:
            raise CorruptBodyError(f"not valid brotli data: {e}") from None

    def finish(self) -> None:
        if not self._d.is_finished():
            raise CorruptBodyError("the brotli body ends before its stream does")


_CODINGS = {"gzip": 31, "x-gzip": 31, "deflate": None}


def decoder_for(content_encoding: list[str]) -> _Decoder:
    """The bounded decoder for a response's ``Content-Encoding`` header lines; refuses
    what it cannot bound."""
    header = ", ".join(content_encoding)
    codings = [c.strip().lower() for c in header.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if len(codings) > 1:
        raise UnsupportedEncodingError(
            f"stacked Content-Encoding {header!r} refused: one coding at most",
            encoding=header,
            reason="stacked_encoding",
        )
    if not codings:
        return _Identity()
    coding = codings[0]
    if coding == "br" and _HAVE_BROTLI:
        return _Brotli()
    if coding in _CODINGS:
        return _Zlib(_CODINGS[coding])
    raise UnsupportedEncodingError(
        f"Content-Encoding {coding!r} is not one of {ACCEPT_ENCODING}",
        encoding=header,
        reason="unsupported_encoding",
    )


async def read_body(
    resp: Response,
    cap: int,
    *,
    truncate: bool = False,
    decode: bool = True,
    meter: BodyMeter | None = None,
) -> bytes:
    """The body of a streamed ``resp``, decoded, never more than ``cap`` bytes.

    Args:
        resp: a response opened with ``stream=True`` whose body is unread.
        cap: the most bytes to return.
        truncate: return the first ``cap`` bytes of a longer body instead of
            raising :class:`BodyTooLargeError` (robots.txt, a reply read only
            to free its connection).
        decode: False returns raw bytes (the body is not used, only drained).
        meter: counts what was received and produced.

    Raises:
        BodyTooLargeError: over ``cap`` without ``truncate``.
        UnsupportedEncodingError: a stacked or unknown ``Content-Encoding``.
        CorruptBodyError: bytes invalid for the encoding, or cut short.
        httpx.HTTPError, aiohttp.ClientError: what the network did, unchanged.
    """
    chunks: list[bytes] = []
    async with contextlib.aclosing(
        iter_body(resp, cap, truncate=truncate, decode=decode, meter=meter)
    ) as pieces:
        async for piece in pieces:
            chunks.append(piece)
    return b"".join(chunks)


async def iter_body(
    resp: Response,
    cap: int,
    *,
    truncate: bool = False,
    decode: bool = True,
    meter: BodyMeter | None = None,
) -> AsyncGenerator[bytes, None]:
    """The body of a streamed ``resp`` as it arrives: decoded pieces of at most
    :data:`CHUNK` bytes, never more than ``cap`` bytes in all (an event stream
    is read this way: each piece as soon as the network delivers it).

    Arguments and errors as for :func:`read_body`; close the generator
    (``contextlib.aclosing``) when leaving early.
    """
    declared = resp.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > cap and not truncate:
        raise BodyTooLargeError(f"declares {declared} bytes, over the {cap}-byte limit", limit=cap)
    decoder: _Decoder = decoder_for(_content_encoding(resp)) if decode else _Identity()
    if isinstance(resp, httpx.Response) and resp.is_stream_consumed:
        # Built from bytes (``MockTransport`` in tests): httpx read and decoded it already.
        decoder = _Identity()
    raw = size = 0
    try:
        async with contextlib.aclosing(_raw(resp)) as stream:
            async for data in stream:
                raw += len(data)
                # The decoder is a lazy generator: leaving this loop stops it producing.
                for piece in decoder.feed(data):
                    size += len(piece)
                    if size > cap:
                        if not truncate:
                            raise BodyTooLargeError(
                                f"body passed the {cap}-byte limit", limit=cap
                            ) from None
                        yield piece[: cap - (size - len(piece))]
                        return
                    yield piece
        if raw:
            decoder.finish()
    finally:
        if meter is not None:
            meter._read(cap, raw, size)


def _content_encoding(resp: Response) -> list[str]:
    if isinstance(resp, httpx.Response):
        return resp.headers.get_list("content-encoding")
    return resp.headers.getall("content-encoding", [])


async def _raw(resp: Response) -> AsyncGenerator[bytes, None]:
    if not isinstance(resp, httpx.Response):
        async for data in resp.content.iter_any():
            yield data
        return
    if resp.is_stream_consumed:
        yield resp.content
        return
    async for data in resp.aiter_raw():
        yield data
