"""What a model call costs: the price table of a model alias and the arithmetic.

A models-file alias may carry ``usd_per_million_tokens``::

    "small": {"provider": "openai", "model": "gpt-4o-mini",
              "usd_per_million_tokens": {"input": 0.15, "cached_input": 0.075, "output": 0.60}}

The client prices every reply it gets (:func:`priced`) from the usage the
provider reported, normalized by the wire format first (``_providers``):
``input_tokens`` counts every prompt token, and ``cached_input_tokens`` /
``cache_write_tokens`` are the parts of it read from / written to the
provider's prompt cache. So a call costs::

    (input - cached_input - cache_write) * input
    + cached_input * cached_input + cache_write * cache_write
    + output * output                              (all per million tokens)

A price left out costs as ``input`` does (OpenAI bills no cache writes, and a
server without a cache reports no cached tokens). An alias without prices
costs 0, quietly: a local model is free. Amounts are ``Decimal``, so a
pipeline's many steps add up exactly.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from aiworker.schemas.messages import type_name
from aiworker.schemas.protocol import Usage

_MILLION = Decimal(1_000_000)
_U = TypeVar("_U", bound=Usage)


def _number(value: Any) -> Any:
    """A price is a JSON number: a string or a boolean in the models file is a mistake."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ValueError(
            f"must be a number (US dollars per million tokens), not {type_name(value)}"
        )
    return value


Price = Annotated[Decimal, BeforeValidator(_number), Field(ge=0, allow_inf_nan=False)]


class Prices(BaseModel):
    """US dollars per million tokens of one model alias (``usd_per_million_tokens``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: Price = Field(description="prompt tokens not read from or written to a cache")
    output: Price = Field(description="generated tokens")
    cached_input: Price | None = Field(
        default=None,
        description="prompt tokens read from the provider's prompt cache (OpenAI "
        "cached_tokens, Anthropic cache_read_input_tokens); default: the input price",
    )
    cache_write: Price | None = Field(
        default=None,
        description="prompt tokens written to the provider's prompt cache (Anthropic "
        "cache_creation_input_tokens); default: the input price",
    )

    def cost(self, usage: Usage) -> Decimal:
        """What ``usage`` costs in US dollars at these prices."""
        cached = min(usage.cached_input_tokens, usage.input_tokens)
        written = min(usage.cache_write_tokens, usage.input_tokens - cached)
        plain = usage.input_tokens - cached - written
        total = (
            plain * self.input
            + cached * (self.input if self.cached_input is None else self.cached_input)
            + written * (self.input if self.cache_write is None else self.cache_write)
            + usage.output_tokens * self.output
        )
        return total / _MILLION


def priced(usage: _U, prices: Prices | None) -> _U:
    """``usage`` with its ``cost_usd`` at ``prices`` (0 without prices)."""
    if prices is None:
        return usage
    return usage.model_copy(update={"cost_usd": prices.cost(usage)})
