"""Spec files and the workers this process knows: every spec, with where it came from.

:func:`load_specs` reads the built-ins' specs (``schemas/workers/``) and
:func:`load_spec_dir` a directory of spec files, each checked; reading happens
on first use, never on import.

A worker process builds its catalog once at start (built-ins, plugins from
the ``aiworker.plugins`` entry points and ``AIWORKER_WORKER_MODULES``, spec
files from ``AIWORKER_WORKER_SPECS``; see ``aiworker.workers.process.worker_set``) and
installs it here. Workflows read it through :func:`current_specs`: this
module is passed through the workflow sandbox, so they see the process's
one catalog and never read a file or import a plugin inside a workflow task.
A process that installed nothing (a script, a unit test) sees the built-ins.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from aiworker.schemas.spec import WorkerSpec


def load_spec_dir(folder: Path) -> list[tuple[WorkerSpec, Path]]:
    """Every ``*.json`` spec in ``folder`` (sorted by name), each checked.

    ``ValueError`` names the file and field of the first bad one; a spec file
    must be named after its ``worker_id`` (``<worker_id>.json``), and the error
    for one that is not says the rule and the name it should have.
    """
    if not folder.is_dir():
        raise ValueError(f"worker spec directory {folder} does not exist")
    out = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".json"):
            continue
        spec = WorkerSpec.from_file(entry)
        if f"{spec.worker_id}.json" != entry.name:
            raise ValueError(
                f"worker spec {entry} declares worker_id {spec.worker_id!r}: a spec file is "
                f"named <worker_id>.json, so rename it {spec.worker_id}.json (or change "
                "its worker_id)"
            )
        out.append((spec, entry))
    return out


BUILTIN_SPECS_DIR = Path(__file__).parent.parent / "schemas" / "workers"


@functools.cache
def load_specs() -> dict[str, WorkerSpec]:
    """The built-in workers' specs (``schemas/workers/*.json``), read once; by worker id."""
    return {spec.worker_id: spec for spec, _ in load_spec_dir(BUILTIN_SPECS_DIR)}


def builtin_spec(worker_id: str) -> WorkerSpec:
    """The spec of one built-in worker (its class names it by this)."""
    return load_specs()[worker_id]


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


def get_spec(worker_id: str) -> WorkerSpec:
    """The spec of one worker this process knows; ``KeyError`` names the known ones."""
    specs = current_specs()
    try:
        return specs[worker_id]
    except KeyError:
        raise KeyError(f"unknown worker {worker_id!r}; known: {', '.join(sorted(specs))}") from None
