"""The toolbox: the only way a worker reaches a tool.

A worker declares the tools it uses; each call gets a :class:`Toolbox` that
holds only the tools the effective constraints allow and counts external
calls against ``max_external_calls``. Asking for any other tool fails with
``tool_not_allowed``; one call over the quota fails with ``budget_exceeded``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiworker.activities.errors import BudgetExceededError, ToolNotAllowedError

# Tools that reach outside the process; each `use` counts one external call
# (`render`: one page, whose own requests are bounded by the tool's per-page quota).
# Defined with the specs: a worker that uses one cannot run as a local activity.
from aiworker.schemas.execution import EXTERNAL_TOOLS


class Toolbox:
    """Tools for one worker call, behind its allow-list and quota."""

    def __init__(
        self,
        available: Mapping[str, Any],
        allowed: frozenset[str],
        max_external_calls: int | None,
        on_external_call: Callable[[str], None] | None = None,
    ) -> None:
        self._available = available
        self.allowed = allowed
        self.max_external_calls = max_external_calls
        self.external_calls = 0
        self._on_external_call = on_external_call

    def use(self, name: str) -> Any:
        """The tool ``name``; counts an external call for external tools."""
        if name not in self.allowed:
            raise ToolNotAllowedError(
                f"tool {name!r} is not in this worker's allow-list "
                f"({', '.join(sorted(self.allowed)) or 'none'})",
                tool=name,
            )
        if name not in self._available:
            raise ToolNotAllowedError(f"tool {name!r} is not available in this process", tool=name)
        if name in EXTERNAL_TOOLS:
            self.charge(name)
        return self._available[name]

    def peek(self, name: str) -> Any | None:
        """The tool ``name`` if allowed and available, counting nothing (to plan a
        call, not to make one); None otherwise."""
        return self._available.get(name) if name in self.allowed else None

    def charge(self, name: str, n: int = 1) -> None:
        """Count ``n`` external calls; ``budget_exceeded`` past the quota."""
        if (
            self.max_external_calls is not None
            and self.external_calls + n > self.max_external_calls
        ):
            raise BudgetExceededError(
                f"external call budget of {self.max_external_calls} exhausted (tool {name!r})",
                resource="external_calls",
                limit=self.max_external_calls,
            )
        self.external_calls += n
        if self._on_external_call is not None:
            self._on_external_call(name)


def tool_secrets(tools: Mapping[str, Any]) -> list[str]:
    """Secrets the process's tools hold (a models file's API keys, say), for redaction.

    A tool that holds secrets says so with a ``secret_values()`` method.
    """
    out: list[str] = []
    for tool in tools.values():
        values = getattr(tool, "secret_values", None)
        if callable(values):
            out.extend(str(v) for v in values())
    return out
