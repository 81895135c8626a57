"""``cache-echo`` of :mod:`support.cache_workers` as a later deployment serves it:
the same ``version``, but its ``output_schema`` changed (``reply`` at most 100
characters, and a ``lang`` may come). A cached answer made under the old spec
must not be served by it (issue 31): the spec's hash is in the key."""

from __future__ import annotations

from typing import Any

from support.cache_workers import Echo, Gone, _spec


class EchoRevised(Echo):
    """``cache-echo`` under a revised output_schema, version unchanged."""

    spec: dict[str, Any] = {
        **_spec("cache-echo"),
        "output_schema": {
            "type": "object",
            "required": ["reply"],
            "properties": {"reply": {"type": "string", "maxLength": 100}, "lang": {}},
        },
    }


WORKERS = [EchoRevised, Gone]
