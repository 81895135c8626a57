"""The workers this process knows: every spec, with where it came from.

A worker process builds its catalog once at start (built-ins, plugins from
the ``aiworker.plugins`` entry points and ``AIWORKER_WORKER_MODULES``, spec
files from ``AIWORKER_WORKER_SPECS``; see ``aiworker.workers.plugins``) and
installs it here. Workflows read it through :func:`current_specs`: this
module is passed through the workflow sandbox, so they see the process's
one catalog and never read a file or import a plugin inside a workflow task.
A process that installed nothing (a script, a unit test) sees the built-ins.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from aiworker.schemas.spec import WorkerSpec, load_specs


@dataclass(frozen=True)
class CatalogEntry:
    """One worker's spec and its origin (``builtin``, ``plugin dist:entry``,
    ``module name``, ``file path``)."""

    spec: WorkerSpec
    origin: str

    @property
    def worker_id(self) -> str:
        return self.spec.worker_id


class Catalog:
    """An immutable set of workers by id."""

    def __init__(self, entries: Iterable[CatalogEntry]) -> None:
        by_id: dict[str, CatalogEntry] = {}
        for e in entries:
            if e.worker_id in by_id:
                raise ValueError(
                    f"worker_id {e.worker_id!r} is defined twice: by "
                    f"{by_id[e.worker_id].origin} and by {e.origin}"
                )
            by_id[e.worker_id] = e
        self.entries: Mapping[str, CatalogEntry] = MappingProxyType(by_id)
        self.specs: Mapping[str, WorkerSpec] = MappingProxyType(
            {k: e.spec for k, e in by_id.items()}
        )

    @classmethod
    def builtins(cls) -> Catalog:
        return cls(CatalogEntry(s, "builtin") for s in load_specs().values())

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self.entries

    def __len__(self) -> int:
        return len(self.entries)


_installed: Catalog | None = None


def install(catalog: Catalog) -> None:
    """Make ``catalog`` this process's worker set (at process start)."""
    global _installed
    _installed = catalog


def uninstall() -> None:
    """Back to the built-ins only (tests that installed a catalog of their own)."""
    global _installed
    _installed = None


@functools.cache
def _builtins() -> Catalog:
    return Catalog.builtins()


def current() -> Catalog:
    """This process's catalog (the built-ins when none was installed)."""
    return _installed if _installed is not None else _builtins()


def current_specs() -> Mapping[str, WorkerSpec]:
    """Every worker spec this process knows, by worker id."""
    return current().specs
