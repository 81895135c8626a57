"""The build id of a worker process: ``AIWORKER_BUILD_ID``, else the package
version plus a hash of the workflow code.

One function for everything that names a build (the live registry, Worker
Deployment versions): two processes with the same workflow code and version
have the same build id, and any change to a workflow module changes it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

from aiworker.schemas.settings import Settings


@functools.cache
def workflow_code_hash() -> str:
    """The sha256 (first 12 hex digits) of every ``aiworker.workflows`` module's
    source, in file-name order; read once per process."""
    found = importlib.util.find_spec("aiworker.workflows")
    folders = list(found.submodule_search_locations or []) if found is not None else []
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(Path(folder).glob("*.py"), key=lambda p: p.name):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def package_version() -> str:
    """The installed aiworker distribution's version (``0+unknown`` when not installed)."""
    try:
        return importlib.metadata.version("aiworker")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def build_id(settings: Settings) -> str:
    """``AIWORKER_BUILD_ID`` when set, else ``<version>+<workflow code hash>``."""
    return settings.build_id or f"{package_version()}+{workflow_code_hash()}"


__all__ = ["build_id", "package_version", "workflow_code_hash"]
