"""The one base of every contract model: unknown fields are an error, values are frozen.

Frozen because a model crosses the workflow sandbox and sits in workflow state:
a value that cannot change under a running workflow cannot make a replay diverge.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    """A strict, immutable pydantic model (``extra="forbid"``, ``frozen=True``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
