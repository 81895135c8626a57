"""Which workers this process knows and serves: built-ins, plugins, spec files.

Read once at process start, never inside a workflow task:

1. the built-ins (``aiworker.activities.builtins``), by name: each is imported
   only when the process serves it;
2. the entry points of group ``aiworker.plugins`` of every installed package:
   each names a :class:`~aiworker.Worker` instance, a Worker subclass (built
   here, with no arguments), or an iterable of them;
3. the modules in ``AIWORKER_WORKER_MODULES``, each with a ``WORKERS`` iterable;
4. the spec files in the directories of ``AIWORKER_WORKER_SPECS``: prompt
   workers (served here, by the llm-call machinery) and external workers
   (known, so pipelines check and call them; served by another process).

Anything wrong (a plugin that raises on import, an entry point or
``WORKERS`` that holds something other than workers, a spec that fails the
model, a Worker class whose spec is not ``implementation.kind`` python, two
workers with one id, a prompt that names an undeclared field, a python spec
file with no class behind it) stops the process with a :class:`PluginError`
naming the plugin or module, the file and the field. Nothing is half
registered: the resulting :class:`WorkerSet` is built whole, then installed
(:func:`install`) as the process's catalog (``aiworker.config.catalog``),
which workflows read.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiworker.activities.builtins import BUILTINS, Builtin
from aiworker.activities.prompt import PromptWorker
from aiworker.activities.sdk import Worker, workers_in
from aiworker.config import catalog
from aiworker.config.catalog import Catalog, CatalogEntry, load_spec_dir, load_specs
from aiworker.config.extras import installed
from aiworker.config.settings import Settings

ENTRY_POINT_GROUP = "aiworker.plugins"


class PluginError(RuntimeError):
    """A plugin or spec file that stops the process at start; the message names it."""


def builtin_entries() -> list[Worker | Builtin]:
    """The built-ins every process knows, by name (tests swap one for a stand-in)."""
    return list(BUILTINS)


class ServedWorkers(Mapping[str, Worker]):
    """The workers a process runs, by id; a built-in is imported and built the first
    time it is looked up (:meth:`Builtin.load`), so a process imports only the
    implementations of the workers it serves. Callers that need only specs read
    :attr:`WorkerSet.specs` and look up just the workers they run.
    """

    def __init__(self, workers: Mapping[str, Worker | Builtin]) -> None:
        self._entries = dict(workers)
        self._built: dict[str, Worker] = {}

    def __getitem__(self, worker_id: str) -> Worker:
        worker = self._built.get(worker_id)
        if worker is None:
            entry = self._entries[worker_id]
            worker = entry.load() if isinstance(entry, Builtin) else entry
            self._built[worker_id] = worker
        return worker

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._entries

    def missing_extra(self, worker_id: str) -> str | None:
        """The extra ``worker_id`` needs and this install lacks, else None."""
        entry = self._entries[worker_id]
        if isinstance(entry, Builtin) and entry.extra and not installed(entry.extra):
            return entry.extra
        return None


@dataclass(frozen=True)
class WorkerSet:
    """Every worker this process knows (``catalog``) and those it runs (``served``)."""

    catalog: Catalog
    served: Mapping[str, Worker]

    @property
    def specs(self) -> Mapping[str, Any]:
        return self.catalog.specs

    def origin(self, worker_id: str) -> str:
        return self.catalog.entries[worker_id].origin


def _from_entry_points(eps: Iterable[importlib.metadata.EntryPoint]) -> list[tuple[Worker, str]]:
    out: list[tuple[Worker, str]] = []
    for ep in sorted(eps, key=lambda e: (e.name, _dist_name(e))):
        dist = _dist_name(ep)
        origin = f"plugin {dist}:{ep.name}" if dist else f"plugin {ep.name}"
        where = f"{origin} ({ep.value})"
        try:
            loaded = ep.load()
        except Exception as e:
            raise PluginError(f"{where} failed to import: {type(e).__name__}: {e}") from e
        try:
            out.extend((w, origin) for w in workers_in(loaded, where=where))
        except TypeError as e:  # its message names `where`
            raise PluginError(str(e)) from e
    return out


def _dist_name(ep: importlib.metadata.EntryPoint) -> str:
    # `dist` is None for an EntryPoint built by hand rather than read from metadata
    return ep.dist.name if ep.dist is not None else ""


def _from_modules(modules: Iterable[str]) -> list[tuple[Worker, str]]:
    out: list[tuple[Worker, str]] = []
    for name in modules:
        where = f"module {name} (AIWORKER_WORKER_MODULES)"
        try:
            module = importlib.import_module(name)
        except Exception as e:
            raise PluginError(f"{where} failed to import: {type(e).__name__}: {e}") from e
        if not hasattr(module, "WORKERS"):
            raise PluginError(
                f"{where} has no WORKERS (an iterable of workers or worker classes); "
                f"file {getattr(module, '__file__', '?')}"
            )
        try:
            out.extend((w, f"module {name}") for w in workers_in(module.WORKERS, where=where))
        except TypeError as e:  # its message names `where`
            raise PluginError(str(e)) from e
    return out


def load_workers(
    settings: Settings,
    *,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    builtins: Iterable[Worker | Builtin] | None = None,
) -> WorkerSet:
    """Load every worker this process knows; :class:`PluginError` on the first problem.

    ``entry_points`` replaces the installed ``aiworker.plugins`` entry points
    and ``builtins`` the built-in workers (tests). A built-in named by a
    :class:`Builtin` is imported only when the process serves it.
    """
    lazy = [
        (b, "builtin")
        for b in (builtin_entries() if builtins is None else builtins)
        if isinstance(b, Builtin)
    ]
    found: list[tuple[Worker, str]] = [
        (w, "builtin")
        for w in (builtin_entries() if builtins is None else builtins)
        if isinstance(w, Worker)
    ]
    eps = (
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if entry_points is None
        else entry_points
    )
    found += _from_entry_points(eps)
    found += _from_modules(settings.worker_modules)
    for w, origin in found:
        # A class serves the kind it implements: PromptWorker the prompt spec it
        # was built from, any other Worker its python code; an external spec
        # is never served here.
        kind = "prompt" if isinstance(w, PromptWorker) else "python"
        if w.spec.kind != kind:
            raise PluginError(
                f"{origin}: worker {w.worker_id!r} is a {type(w).__qualname__}, so its "
                f"spec's implementation.kind must be {kind!r}, not {w.spec.kind!r}"
            )
    entries = (
        [CatalogEntry(b.spec, origin) for b, origin in lazy]
        + [CatalogEntry(w.spec, origin) for w, origin in found]
        + workflow_entries()
    )
    served: dict[str, Worker | Builtin] = {}
    defined: dict[str, str] = {e.worker_id: "builtin" for e in workflow_entries()}
    for b, origin in lazy:
        _claim(defined, b.worker_id, origin)
        served[b.worker_id] = b
    for w, origin in found:
        _claim(defined, w.worker_id, _described(w, origin))
        served[w.worker_id] = w
    for folder in settings.worker_specs:
        try:
            files = load_spec_dir(folder)
        except ValueError as e:
            raise PluginError(f"{e} (AIWORKER_WORKER_SPECS)") from None
        for spec, path in files:
            origin = f"file {path}"
            if spec.kind == "workflow":
                raise PluginError(
                    f"worker spec {path}: implementation.kind 'workflow' is aiworker's own "
                    "(llm-agent); spec directories hold 'prompt' and 'external' workers"
                )
            if spec.kind == "python":
                raise PluginError(
                    f"worker spec {path}: implementation.kind is 'python', but a python "
                    "worker comes with its class (a plugin or AIWORKER_WORKER_MODULES); "
                    "spec directories hold 'prompt' and 'external' workers"
                )
            _claim(defined, spec.worker_id, origin)
            entries.append(CatalogEntry(spec, origin))
            if spec.kind == "prompt":
                served[spec.worker_id] = PromptWorker(spec)
    cat = Catalog(entries)
    return WorkerSet(cat, ServedWorkers(served))


def _claim(defined: dict[str, str], worker_id: str, where: str) -> None:
    if worker_id in defined:
        raise PluginError(
            f"worker_id {worker_id!r} is defined twice: by {defined[worker_id]} and by {where}"
        )
    defined[worker_id] = where


def _described(w: Worker, origin: str) -> str:
    """``origin`` and the file that defines ``w``'s class (a duplicate names both)."""
    if origin == "builtin" or isinstance(w, PromptWorker):
        return origin  # aiworker's own code: the origin says it all
    module = sys.modules.get(type(w).__module__)
    return f"{origin} ({getattr(module, '__file__', None) or type(w).__module__})"


def workflow_entries() -> list[CatalogEntry]:
    """The built-ins whose steps run as child workflows (``llm-agent``): in every
    catalog, served by no activity (the pipeline queue runs their workflow)."""
    return [CatalogEntry(s, "builtin") for s in load_specs().values() if s.kind == "workflow"]


def builtin_set() -> WorkerSet:
    """The built-ins alone (scripts and tests that load no plugins)."""
    entries = builtin_entries()
    return WorkerSet(
        Catalog([CatalogEntry(b.spec, "builtin") for b in entries] + workflow_entries()),
        ServedWorkers({b.worker_id: b for b in entries}),
    )


def install(workers: WorkerSet) -> WorkerSet:
    """Make ``workers`` this process's catalog, which its workflows read."""
    catalog.install(workers.catalog)
    return workers
