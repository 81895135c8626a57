"""Configuration files read with a size cap (tenants, API keys, hooks)."""

from __future__ import annotations

from pathlib import Path


def read_capped(path: Path, limit: int, label: str, error: type[Exception]) -> bytes:
    """The bytes of the file at ``path``, at most ``limit`` of them.

    Raises:
        error: the file cannot be read, or is larger than ``limit`` bytes; the
            message starts with ``label`` (the file as the user named it).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise error(f"{label}: cannot read: {e.strerror or e}") from None
    if len(raw) > limit:
        raise error(f"{label}: larger than {limit} bytes")
    return raw
