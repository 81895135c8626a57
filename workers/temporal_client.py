"""The Temporal client, configured through the SDK's own ``temporalio.envconfig``.

``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, TLS
settings and profiles in ``temporal.toml`` all work as the SDK documents.
Every client uses the pydantic data converter; with a
:class:`workers.telemetry.Telemetry` it also gets the process's Temporal
runtime (SDK metrics, Core logs) and the tracing interceptors, which the
workers built from it inherit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig

if TYPE_CHECKING:
    from workers.telemetry import Telemetry


def connect_config(profile: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Connection keyword arguments from envconfig, with explicit overrides."""
    cfg: dict[str, Any] = dict(ClientConfig.load_client_connect_config(profile=profile))
    cfg.setdefault("target_host", "localhost:7233")
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    return cfg


async def connect(
    profile: str | None = None,
    *,
    interceptors: list[Any] | None = None,
    telemetry: Telemetry | None = None,
    **overrides: Any,
) -> Client:
    """Connect to Temporal as envconfig says (default ``localhost:7233``)."""
    cfg = connect_config(profile, **overrides)
    target = cfg.pop("target_host")
    all_interceptors = [*(telemetry.interceptors if telemetry else []), *(interceptors or [])]
    if telemetry is not None:
        cfg.setdefault("runtime", telemetry.runtime)
    return await Client.connect(
        target,
        data_converter=pydantic_data_converter,
        interceptors=all_interceptors,
        **cfg,
    )
