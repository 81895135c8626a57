"""The process side of aiworker, one subpackage per role.

- :mod:`~aiworker.workers.cli`: the ``aiworker`` command line.
- :mod:`~aiworker.workers.client`: starting, watching and waiting on runs
  (``PipelineClient``, the Temporal connection and data converter).
- :mod:`~aiworker.workers.frontdoor`: the HTTP front door (``aiworker serve``).
- :mod:`~aiworker.workers.process`: the worker process and its wiring (the
  plugin, the registries, telemetry, payload storage, deployments, Lambda).
- :mod:`~aiworker.workers.devstack`: ``aiworker dev`` and ``demo`` (the dev
  server, the local model server, the demo site, the supervisor).
- :mod:`~aiworker.workers.conformance` and :mod:`~aiworker.workers.schedules`.

Modules that lived directly in this package before it was split by role keep
importing from their old paths, with a ``DeprecationWarning`` naming the new
one. The redirect is written here rather than left as one re-exporting module
per old name: it is one table, and nothing in aiworker itself may use an old
path (the test suite turns the warning into an error).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

#: old module (under ``aiworker.workers``) -> where it lives now.
MOVED: dict[str, str] = {
    "arenas": "devstack.arenas",
    "cli_common": "cli.common",
    "cli_errors": "cli.errors",
    "cli_items": "cli.items",
    "cli_parser": "cli.parser",
    "cli_serve": "cli.serve",
    "conformance_checks": "conformance.checks",
    "demo_site": "devstack.demo_site",
    "deployment_commands": "cli.deployment_commands",
    "deployments": "process.deployments",
    "devserver": "devstack.devserver",
    "http_server": "process.probes",
    "lambda_handler": "process.lambda_handler",
    "live_registry": "process.live_registry",
    "logs": "process.logs",
    "modelserver": "devstack.modelserver",
    "payload_storage": "process.payload_storage",
    "pipeline_settings": "process.pipeline_settings",
    "plugin": "process.plugin",
    "plugins": "process.plugins",
    "progress": "client.progress",
    "registry": "process.registry",
    "replay": "process.replay",
    "resources": "process.resources",
    "schedule_commands": "cli.schedule_commands",
    "schedule_specs": "schedules.specs",
    "sdk_metrics": "process.sdk_metrics",
    "serve": "frontdoor.serve",
    "serve_auth": "frontdoor.auth",
    "serve_http": "frontdoor.http",
    "serve_service": "frontdoor.service",
    "step_items": "client.step_items",
    "supervisor": "devstack.supervisor",
    "telemetry": "process.telemetry",
    "temporal_client": "client.temporal_client",
    "visibility": "client.visibility",
    "waits": "client.waits",
    "watch": "client.watch",
    "worker": "process.worker",
}


def _moved(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path goes away in the next minor release",
        DeprecationWarning,
        stacklevel=3,
    )


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module path with the module at its new path."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        prefix, _, name = fullname.rpartition(".")
        if prefix != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        new = f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}"
        _moved(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path has already run."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def moved_names(package: str, module: str) -> Callable[[str], Any]:
    """A package ``__getattr__`` for a package that replaced a module of its
    name: ``from aiworker.workers.client import PipelineClient`` still works,
    with a warning naming ``module``."""

    def __getattr__(name: str) -> Any:
        # A submodule's name is not forwarded: ``from package import submodule``
        # asks here first, and the import system then loads the submodule.
        if name.startswith("_") or importlib.util.find_spec(f"{package}.{name}") is not None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        target = importlib.import_module(module)
        if not hasattr(target, name):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _moved(f"{package}.{name}", f"{module}.{name}")
        return getattr(target, name)

    return __getattr__
