"""The Temporal client, configured through the SDK's own ``temporalio.envconfig``.

``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, TLS
settings and profiles in ``temporal.toml`` all work as the SDK documents.
A client told nothing (no address, profile, ``TEMPORAL_ADDRESS``,
``TEMPORAL_CONFIG_FILE`` or ``TEMPORAL_PROFILE``, no address in the default
config file) uses the ``aiworker dev`` stack running for its data directory
(``./.aiworker`` by default), through the envconfig profile file that stack
wrote, and says so on stderr (:func:`resolve_target`,
:mod:`aiworker.workers.devstack.state`); else ``localhost:7233``.
Every client uses the pydantic data converter with a failure converter that
drops failure details it cannot decode (:mod:`workers.failures`); with
settings, the converter also moves large payloads to external storage
(:func:`data_converter`); with a
:class:`workers.process.telemetry.Telemetry` the client also gets the process's
Temporal runtime (SDK metrics, Core logs) and the tracing interceptors. Workers
built from a client inherit all of it.

A frontend that has just started accepts connections before it can serve
("Frontend is not healthy yet"); :func:`connect` with ``wait_seconds`` retries
(bounded) until the connection succeeds and the gRPC health check says
``SERVING``, which is how ``aiworker dev`` and ``aiworker worker`` start
reliably on a busy machine or before their server is up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_core import to_json
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import (
    PydanticJSONPlainPayloadConverter,
    PydanticPayloadConverter,
    pydantic_data_converter,
)
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
)
from temporalio.envconfig import ClientConfig
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from aiworker.config.settings import Settings
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.pipeline import SPILL_METADATA
from aiworker.schemas.wire import COMPACT_MODELS, compact_exclude
from aiworker.workers.failures import TolerantFailureConverter

if TYPE_CHECKING:
    from aiworker.workers.devstack.state import DevStack
    from aiworker.workers.process.telemetry import Telemetry

DEFAULT_ADDRESS = "localhost:7233"
_DEFAULT_ADDRESSES = frozenset((DEFAULT_ADDRESS, "127.0.0.1:7233"))
# Variables by which a person chose a server (or a profile) themselves.
_CHOOSING_VARIABLES = ("TEMPORAL_ADDRESS", "TEMPORAL_CONFIG_FILE", "TEMPORAL_PROFILE")


class _CheckedJSONConverter(PydanticJSONPlainPayloadConverter):
    """pydantic's JSON payload converter, whose refusals of the JSON itself are
    ``invalid_input`` failures.

    Its parser refuses JSON nested deeper than about 200 levels (and malformed
    JSON from a client outside the SDK) with a ``ValidationError``, which the
    SDK turns into a failed workflow task, retried forever. Raised as a
    non-retryable ``ApplicationError``, the same refusal fails the workflow
    (or the activity) at once with a stable code.
    """

    def to_payload(self, value: Any) -> Payload | None:
        """JSON as pydantic writes it; the envelopes without their empty defaults
        (:mod:`aiworker.schemas.wire`)."""
        payload: Payload | None
        if isinstance(value, COMPACT_MODELS):
            payload = Payload(
                metadata={"encoding": self.encoding.encode()},
                data=to_json(value, exclude=compact_exclude(value) or None),
            )
        else:
            payload = super().to_payload(value)
        if payload is not None and getattr(type(value), "spill", False) is True:
            # a for_each chunk's items or results: to the payload store (payload_storage)
            payload.metadata[SPILL_METADATA] = b"1"
        return payload

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        try:
            return super().from_payload(payload, type_hint)
        except ValidationError as e:
            errors = e.errors()
            if not errors or errors[0]["type"] != "json_invalid":
                raise
            raise ApplicationError(
                f"payload is not JSON that can be decoded: {errors[0]['msg'][:200]}",
                type=ErrorCode.INVALID_INPUT.value,
                non_retryable=True,
            ) from None


# One JSON converter for every payload converter of the process. The SDK builds a
# payload converter per workflow activation (twice) and per workflow instance;
# sharing the JSON converter keeps its pydantic serializer built once and its cache
# of type adapters warm across all of them. It holds no per-call state (the cache
# is a thread-safe LRU of TypeAdapters), so sharing it is safe across threads.
_JSON_CONVERTER = _CheckedJSONConverter()


class CheckedPayloadConverter(PydanticPayloadConverter):
    """The pydantic payload converter with :class:`_CheckedJSONConverter` for JSON."""

    def __init__(self) -> None:
        # Not PydanticPayloadConverter.__init__: it would build a JSON converter
        # only to replace it; the composite of the SDK's converters, JSON swapped.
        CompositePayloadConverter.__init__(
            self,
            *(
                _JSON_CONVERTER if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            ),
        )


class TemporalUnreachableError(ConnectionError):
    """The Temporal frontend did not answer the connection (address, TLS or server down)."""


def data_converter(settings: Settings | None) -> DataConverter:
    """The pydantic converter, with external storage for large payloads from ``settings``.

    Failures convert with :class:`workers.failures.TolerantFailureConverter`:
    an external worker's undecodable failure details must fail its step, not
    every workflow task of the pipeline. JSON the parser refuses (too deep,
    malformed) is ``invalid_input`` (:class:`CheckedPayloadConverter`), for
    the same reason.
    """
    converter = dataclasses.replace(
        pydantic_data_converter,
        payload_converter_class=CheckedPayloadConverter,
        failure_converter_class=TolerantFailureConverter,
    )
    if settings is None:
        return converter
    from aiworker.workers.process.payload_storage import external_storage

    return dataclasses.replace(converter, external_storage=external_storage(settings))


def default_data_dir() -> Path:
    """The data directory of a client built without settings: ``AIWORKER_DATA_DIR``
    or ``./.aiworker``, as :class:`~aiworker.config.settings.Settings` reads it."""
    return Path(os.environ.get("AIWORKER_DATA_DIR") or ".aiworker")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a client connects, and why there.

    Attributes:
        config: keyword arguments of ``Client.connect`` (``target_host`` included).
        dev_stack: the ``aiworker dev`` stack the address came from, if it did.
        notice: one line for a person (``aiworker: ...``) when the server is
            neither one they named nor the default: a dev stack found on other
            ports, or a stale dev state ignored.
    """

    config: dict[str, Any]
    dev_stack: DevStack | None = None
    notice: str | None = None


def _chosen(profile: str | None, cfg: dict[str, Any], overrides: dict[str, Any]) -> bool:
    """Whether a person chose the server: an argument, a profile, a variable, or
    an address in the default envconfig file (all of which win over a dev stack)."""
    if overrides.get("target_host") or profile or cfg.get("target_host"):
        return True
    return any(os.environ.get(name) for name in _CHOOSING_VARIABLES)


def resolve_target(
    profile: str | None = None, *, data_dir: Path | None = None, **overrides: Any
) -> Target:
    """Connection arguments from envconfig, with explicit overrides; when nobody
    chose a server, those of the live ``aiworker dev`` stack of ``data_dir``.

    Args:
        profile: the envconfig profile.
        data_dir: where a dev stack records itself (default :func:`default_data_dir`).
        **overrides: connection arguments over envconfig's (``None`` ignored).
    """
    from aiworker.workers.devstack import state

    given = {k: v for k, v in overrides.items() if v is not None}
    cfg: dict[str, Any] = dict(ClientConfig.load_client_connect_config(profile=profile))
    stack = None
    notice = None
    if not _chosen(profile, cfg, given):
        place = data_dir if data_dir is not None else default_data_dir()
        stack, stale = state.find(place)
        if stack is not None:
            # envconfig reads the stack's profile; TEMPORAL_NAMESPACE and the like still apply
            cfg = dict(ClientConfig.load_client_connect_config(config_file=str(stack.profile_path)))
            cfg.setdefault("target_host", stack.address)
            where = shown_path(place / state.STATE_FILE)
            if cfg["target_host"] not in _DEFAULT_ADDRESSES:  # the default says nothing
                notice = (
                    f"aiworker: using the aiworker dev stack at {cfg['target_host']} "
                    f"(from {where}; TEMPORAL_ADDRESS or --address choose another server)"
                )
        elif stale is not None:
            recorded = shown_path(place / state.STATE_FILE)
            notice = (
                f"aiworker: ignoring the dev stack recorded in {recorded}"
                f": {stale}; connecting to {DEFAULT_ADDRESS}"
            )
    cfg.setdefault("target_host", DEFAULT_ADDRESS)
    cfg.update(given)
    return Target(cfg, stack, notice)


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    path = path.absolute()
    try:
        return f"./{path.relative_to(Path.cwd())}"
    except ValueError:
        return str(path)


def connect_config(
    profile: str | None = None, *, data_dir: Path | None = None, **overrides: Any
) -> dict[str, Any]:
    """Connection keyword arguments from envconfig, with explicit overrides
    (the dev stack's when nobody chose a server: :func:`resolve_target`)."""
    return resolve_target(profile, data_dir=data_dir, **overrides).config


def dev_ui_url(target_host: str, data_dir: Path | None = None) -> str | None:
    """The Web UI of the ``aiworker dev`` stack recorded in ``data_dir`` (or beside
    ``TEMPORAL_CONFIG_FILE``) when it serves ``target_host``, else None (for the
    UI link of a run)."""
    from aiworker.workers.devstack import state

    places = [data_dir if data_dir is not None else default_data_dir()]
    if profile_file := os.environ.get("TEMPORAL_CONFIG_FILE"):  # the profile a stack wrote
        places.append(Path(profile_file).parent)
    for place in places:
        stack = state.read(place)
        if stack is not None and stack.address == target_host:
            return stack.ui_url
    return None


_said: set[str] = set()


def _say_once(line: str) -> None:
    """A notice on stderr (never stdout, where ``--json`` output goes), once a process."""
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


async def connect(
    profile: str | None = None,
    *,
    interceptors: list[Any] | None = None,
    telemetry: Telemetry | None = None,
    settings: Settings | None = None,
    wait_seconds: float = 0.0,
    on_wait: Callable[[str], None] | None = None,
    **overrides: Any,
) -> Client:
    """Connect to Temporal as envconfig says, or to the ``aiworker dev`` stack of
    the data directory when nobody chose a server (:func:`resolve_target`),
    else ``localhost:7233``.

    Pass ``settings`` so that payloads over the threshold go to (and come
    from) the configured store; every process that touches the same
    workflows must be able to read them.

    Args:
        profile: the envconfig profile.
        interceptors: client interceptors beside the telemetry's.
        telemetry: the process's telemetry (runtime and tracing interceptors).
        settings: the process's settings (external payload storage).
        wait_seconds: how long to keep trying until the frontend is healthy;
            0 tries once and does not ask for health.
        on_wait: called once with the target when the first try failed and
            the wait begins (to tell a person why nothing happens yet).
        **overrides: connection arguments over envconfig's (``target_host``...).

    Raises:
        TemporalUnreachableError: the connection failed, or the frontend was
            not healthy within ``wait_seconds``.
    """
    from aiworker.workers.client.exit_guard import guard_exit

    guard_exit()
    resolved = resolve_target(
        profile, data_dir=settings.data_dir if settings is not None else None, **overrides
    )
    if resolved.notice is not None:
        _say_once(resolved.notice)
    cfg = dict(resolved.config)
    target = cfg.pop("target_host")
    all_interceptors = [*(telemetry.interceptors if telemetry else []), *(interceptors or [])]
    if telemetry is not None:
        cfg.setdefault("runtime", telemetry.runtime)
    deadline = time.monotonic() + wait_seconds
    pause = 0.2
    while True:
        try:
            client = await Client.connect(
                target,
                data_converter=data_converter(settings),
                interceptors=all_interceptors,
                **cfg,
            )
        except RuntimeError as e:
            # The SDK's core reports a failed connect as a bare RuntimeError
            # ("Failed client connect: ..."); give callers a type to catch.
            if wait_seconds <= 0:
                raise TemporalUnreachableError(str(e)) from e
            problem = str(e)
        else:
            if wait_seconds <= 0:
                return client
            unhealthy = await _health_problem(client)
            if unhealthy is None:
                return client
            problem = unhealthy
        left = deadline - time.monotonic()
        if left <= 0:
            raise TemporalUnreachableError(
                f"Temporal at {target} was not healthy within {wait_seconds:g}s ({problem})"
            )
        if on_wait is not None:
            on_wait(target)
            on_wait = None
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, 2.0)


async def _health_problem(client: Client) -> str | None:
    """None when the frontend's gRPC health check answers SERVING; else why not."""
    try:
        healthy = await client.service_client.check_health(timeout=timedelta(seconds=5))
    except RPCError as e:
        return f"health check: {e.message}"
    return None if healthy else "health check: not serving"
