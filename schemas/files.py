"""Configuration files read with a size cap (tenants, API keys, hooks, MCP servers)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

_Model = TypeVar("_Model", bound=BaseModel)


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


def load_json_model(path: Path, limit: int, model: type[_Model], error: type[Exception]) -> _Model:
    """A JSON file checked strictly against ``model`` (a quoted number or a string for
    a list is a typo, not a value); ``error`` names the file and every bad field."""
    raw = read_capped(path, limit, str(path), error)
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            where = ".".join(str(p) for p in err["loc"]) or "(the whole file)"
            problems.append(f"{where}: {err['msg']}")
        raise error(f"{path}: {'; '.join(problems)}") from None
