"""The built-in workers: what every worker process knows before plugins and spec
files add theirs. A new built-in is one module with a
:class:`~aiworker.activities.sdk.Worker` subclass, one spec file in
``schemas/workers/`` and its line in :data:`BUILTINS`.

Each built-in is named here by module and class, not imported: a process loads
a worker's implementation only when it serves it (:meth:`Builtin.load`), so
``aiworker check`` never imports the scraper, and a core install (no extras)
serves the validator without the HTML parser it does not have. Serving a worker
whose extra is missing raises :class:`~aiworker.config.extras.MissingExtraError`
naming the extra.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from aiworker.activities.sdk import Worker
from aiworker.config.catalog import builtin_spec
from aiworker.config.extras import MissingExtraError, require
from aiworker.schemas import names
from aiworker.schemas.spec import WorkerSpec


@dataclass(frozen=True)
class Builtin:
    """A built-in worker by name: its id, its class's module and name, its extra."""

    worker_id: str
    module: str
    cls: str
    extra: str | None = None

    @property
    def spec(self) -> WorkerSpec:
        """The worker's spec (read from ``schemas/workers/``, nothing imported)."""
        return builtin_spec(self.worker_id)

    def load(self) -> Worker:
        """A fresh instance; :class:`MissingExtraError` when its extra is not installed."""
        if self.extra is not None:
            require(self.extra, self.worker_id)
        try:
            module = importlib.import_module(self.module)
        except ImportError as e:  # a part of the extra is missing (a broken install)
            if self.extra is None:
                raise
            raise MissingExtraError(self.worker_id, self.extra) from e
        worker: Worker = getattr(module, self.cls)()
        return worker


BUILTINS: tuple[Builtin, ...] = (
    Builtin("validator", "aiworker.activities.validator", "Validator"),
    Builtin("aggregator", "aiworker.activities.aggregator", "Aggregator"),
    Builtin("web-scrape", "aiworker.activities.web_scrape", "WebScrape", extra="scrape"),
    Builtin("llm-call", "aiworker.activities.llm_call", "LlmCall"),
    Builtin("publish", "aiworker.activities.publish", "Publish"),
    # no extra here: it shares aiworker-llm with llm-call, which a core install serves;
    # a call in a process without the 'llm' extra fails naming it (mcp_call.py)
    Builtin(names.MCP_CALL, "aiworker.activities.mcp_call", "McpCall"),
)


def builtin_workers() -> list[Worker]:
    """A fresh instance of every built-in worker (imports each; needs every extra)."""
    return [b.load() for b in BUILTINS]
