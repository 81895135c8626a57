"""Text from Temporal, printed to a terminal safely.

Workflow ids, process identities, build ids, step ids, error messages and
outputs come from whoever can reach the namespace. Printed raw, an escape
sequence in one of them drives the reader's terminal: ``ESC [2J`` clears the
screen, ``ESC ] 52`` writes the clipboard, a C1 ``CSI`` (U+009B) does what
``ESC [`` does on some terminals, and bidirectional overrides make a line read
other than it is. Two layers keep them out:

- :func:`safe_text`, for a value placed in a table cell or a line: every C0
  and C1 control, DEL and the bidirectional and line-separator format
  characters become visible escapes (``\\x1b``, ``\\u202e``), newlines and tabs
  included, so a value cannot forge a row either.
- :class:`SafeStream`, which the CLI puts in front of stdout and stderr for
  every command: the same characters for whatever a printer forgot, newlines
  and tabs kept, each as a JSON escape (``\\u001b``), so JSON output is
  unchanged in meaning: ``json.dumps`` leaves DEL, C1 and format characters
  raw inside strings (and everything non-ASCII with ``ensure_ascii=False``),
  and their escape decodes to the same character.

The CLI's own live progress line is the one writer of control sequences; it
writes them to :func:`raw_stream`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import IO, Any

# C0 controls, DEL and C1 controls, then format characters that reorder or
# break lines on a terminal (ALM, LRM, RLM, LRE..RLO, LRI..PDI, LS, PS).
_UNSAFE = [
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    0x2028,
    0x2029,
]


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


_ALL = {c: _escape(c) for c in _UNSAFE}
# JSON's escape for every code point: valid inside a JSON string, plain outside one
_KEEP_LINES = {c: f"\\u{c:04x}" for c in _UNSAFE if c not in (0x0A, 0x09)}


def safe_text(value: object) -> str:
    """``value`` as text with every control and line-breaking format character
    escaped (newlines and tabs too): safe in one cell of one line."""
    return str(value).translate(_ALL)


def safe_lines(text: str) -> str:
    """``text`` with every control escaped (``\\u001b``) but its newlines and tabs."""
    return text.translate(_KEEP_LINES)


class SafeStream:
    """A text stream that writes through :func:`safe_lines`; everything else (flush,
    isatty, encoding, fileno) is the wrapped stream's."""

    def __init__(self, raw: IO[str]) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(safe_lines(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def raw_stream(out: IO[str]) -> IO[str]:
    """The stream under a :class:`SafeStream` (``out`` itself otherwise): for the
    CLI's own control sequences only."""
    raw = out.raw if isinstance(out, SafeStream) else out
    return raw


@contextlib.contextmanager
def safe_streams() -> Iterator[None]:
    """stdout and stderr behind :class:`SafeStream` for the block."""
    out, errs = sys.stdout, sys.stderr
    sys.stdout = SafeStream(out)
    sys.stderr = SafeStream(errs)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, errs


__all__ = ["SafeStream", "raw_stream", "safe_lines", "safe_streams", "safe_text"]
