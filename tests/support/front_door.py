"""The HTTP front door as a test drives it: ``aiworker serve`` as its own process on
a loopback port, with a keys file and a hooks file written for the test.

The server is the real command (uvicorn, FastAPI, the keys and hooks loaded
from files); the test talks to it with httpx like any client would. Stopped by
its PID (:class:`~support.procs.WorkerProcess`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from conftest import Stack, running_stack

from aiworker.workers.frontdoor.auth import hash_key
from support.payloads import stack_settings
from support.procs import WorkerProcess
from support.standins import fail, standin
from support.waiting import wait_until

GITHUB_SECRET = "gh-secret-0123456789abcdef"
STRIPE_SECRET = "whsec_0123456789abcdef0123"
DOCS_SECRET = "docs-secret-0123456789abcdef"
# Keys as `aiworker keys add` draws them would do; fixed ones keep failures readable.
KEYS = {
    "ci": ("acme", "aiw_ci-key-0123456789abcdefghijklmnop", None),
    "beta": ("beta", "aiw_beta-key-0123456789abcdefghijklmn", None),
    "slow": ("acme", "aiw_slow-key-0123456789abcdefghijklmn", "3/min"),
}
MAX_BODY = 65536
_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


def hook_pipeline() -> dict[str, Any]:
    """The hooks' pipeline: checks the webhook body has an ``action`` and echoes it."""
    return {
        "name": "on-event",
        "steps": [
            {
                "id": "check",
                "worker": "validator",
                "input": {
                    "data": "${{ inputs.body }}",
                    "schema": {"type": "object", "required": ["action"]},
                },
            }
        ],
        "output": {
            "valid": "${{ steps.check.outputs.valid }}",
            "action": "${{ inputs.body.action }}",
            "delivery": "${{ inputs.delivery }}",
        },
    }


def write_config(directory: Path) -> dict[str, str]:
    """The keys file, the hooks file and the hooks' pipeline; the settings naming them."""
    keys = [
        {"name": n, "tenant": t, "sha256": hash_key(k), **({"rate_limit": r} if r else {})}
        for n, (t, k, r) in KEYS.items()
    ]
    (directory / "keys.json").write_text(json.dumps({"keys": keys}))
    (directory / "on-event.json").write_text(json.dumps(hook_pipeline()))
    hooks = [
        {
            "name": "gh",
            "pipeline": "on-event.json",
            "tenant": "acme",
            "signature": "github",
            "secret": GITHUB_SECRET,
        },
        {  # the hook docs/serve.md sends to
            "name": "github-push",
            "pipeline": "on-event.json",
            "tenant": "acme",
            "signature": "github",
            "secret_env": "GITHUB_WEBHOOK_SECRET",
        },
        {
            "name": "pay",
            "pipeline": "on-event.json",
            "tenant": "acme",
            "signature": "stripe",
            "secret_env": "TEST_STRIPE_SECRET",
            "tolerance_seconds": 300,
        },
    ]
    (directory / "hooks.json").write_text(json.dumps({"hooks": hooks}))
    return {
        "AIWORKER_API_KEYS_FILE": str(directory / "keys.json"),
        "AIWORKER_HOOKS_FILE": str(directory / "hooks.json"),
        "AIWORKER_SERVE_MAX_BODY_BYTES": str(MAX_BODY),
        "TEST_STRIPE_SECRET": STRIPE_SECRET,
        "GITHUB_WEBHOOK_SECRET": DOCS_SECRET,
    }


@dataclass
class Door:
    """A running front door: its base URL and process."""

    url: str
    proc: WorkerProcess


@asynccontextmanager
async def running_door(env: dict[str, str], log: Path, *flags: str) -> AsyncIterator[Door]:
    """``aiworker serve --host 127.0.0.1 --port 0 [FLAGS]`` until the block ends."""
    cmd = [sys.executable, "-m", "aiworker.workers.cli.main", "serve", "--host", "127.0.0.1"]
    proc = WorkerProcess([*cmd, "--port", "0", *flags], env, log)
    try:

        def port() -> str | None:
            if proc.proc.poll() is not None:
                raise AssertionError(f"aiworker serve exited: {proc.output()}")
            m = _LISTENING.search(proc.output())
            return m.group(1) if m else None

        found = await wait_until(port, "aiworker serve to listen", timeout=60)
        yield Door(f"http://127.0.0.1:{found}", proc)
    finally:
        proc.terminate(timeout=15)
        proc.close()


def bearer(name: str) -> dict[str, str]:
    """The Authorization header of the test key ``name``."""
    return {"Authorization": f"Bearer {KEYS[name][1]}"}


def github_headers(body: bytes, delivery: str, secret: str = GITHUB_SECRET) -> dict[str, str]:
    """Headers GitHub sends with a delivery, signed with ``secret``."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": "push",
        "Content-Type": "application/json",
    }


def stripe_headers(body: bytes, at: float | None = None) -> dict[str, str]:
    """Headers Stripe sends, signed at ``at`` (default now)."""
    stamp = str(int(time.time() if at is None else at))
    digest = hmac.new(STRIPE_SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256)
    return {
        "Stripe-Signature": f"t={stamp},v1={digest.hexdigest()}",
        "Content-Type": "application/json",
    }


async def _garbage(_: dict[str, Any]) -> dict[str, Any]:
    raise fail("invalid_output", "the model returned garbage")


@asynccontextmanager
async def door_stack(client: Any, folder: Path) -> AsyncIterator[Stack]:
    """The workers a front door test starts pipelines on: the real stack, with an
    aggregator that always fails ``invalid_output`` (a step that ends failed)."""
    acts = {"aggregator": standin("aggregator", _garbage)}
    async with running_stack(client, stack_settings(folder), replace_activities=acts) as s:
        yield s


def api_error(r: httpx.Response, status: int, code: str) -> str:
    """A refusal's message, after checking its status, its code and its shape
    (``{"error": {...}}`` only, and no Python reprs or tracebacks in the message)."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == code, body
    message: str = body["error"]["message"]
    for python in ("None", "True", "False", "{'", "Traceback"):
        assert python not in message, message
    return message
