"""The front door's OpenAPI document against the server itself: schemathesis (a real,
external API tester) generates requests from ``/openapi.json`` and sends them to a
real ``aiworker serve`` on loopback, over a real worker stack and Temporal dev
server, with a valid API key and without one.

Checks asked of it, and why each:

- ``not_a_server_error``: no request, however odd, is a 5xx (the door answers
  every refusal with a stable code, never ``internal``);
- ``status_code_conformance``: every status the door answers is one its document
  lists for that operation (a client generated from the document handles it);
- ``content_type_conformance``: the body is of a media type the document names;
- ``response_headers_conformance``: documented headers are present and of their schema;
- ``response_schema_conformance``: the body matches the documented schema (every
  refusal is ``{"error": {"code", "message"}}``);
- ``unsupported_method`` and ``allow_header_conformance``: a method a path does not
  have is ``405`` with an ``Allow`` header naming the ones it has (RFC 9110 §15.5.6);
- ``positive_data_acceptance``: a request the document calls valid is not refused
  as malformed (400/422): ``last_event_id``, an empty ``redrive`` body, a ``null``
  heartbeat body;
- ``negative_data_rejection``: a request the document calls invalid (a
  ``timeout`` over 60, a review body with an unknown field, a start body that is
  not an object) is refused with a 4xx, not started or half-run.

Left out: ``missing_required_header`` (the
key is a security scheme, not a header parameter; ``test_serve.py`` refuses
requests without one), ``use_after_free`` and ``ensure_resource_availability``
(stateful links the document does not declare), ``ignored_auth`` and
``object_level_authorization`` (the key and tenant checks have their own tests
with two tenants' keys in ``test_serve.py``). ``positive_data_acceptance`` is
off for ``POST /v1/pipelines`` only: see :data:`CONFIG`.

Each run (with a key, without) is bounded (examples per operation, one worker,
a fixed seed, no shrinking) so it takes about a minute on a loaded machine and
fails the same way every time.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.front_door import KEYS, Door, door_stack, running_door, write_config
from support.procs import worker_env
from temporalio.testing import WorkflowEnvironment

SEED = 47
EXAMPLES = 15
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "unsupported_method",
    "allow_header_conformance",
    "positive_data_acceptance",
    "negative_data_rejection",
)
LEFT_OUT = (
    "missing_required_header",
    "use_after_free",
    "ensure_resource_availability",
    "ignored_auth",
    "object_level_authorization",
)
# The checks go in the file, not on the command line: a check named there wins over
# an operation's own setting. A start's body is a pipeline: the document says "a
# JSON object", and which objects are pipelines (known workers, no cycle,
# references that resolve) is the pipeline check's to say with a 400; no generated
# object is expected to pass it.
CONFIG = "\n".join(
    [
        "[checks]",
        *(f"{name}.enabled = true" for name in CHECKS),
        *(f"{name}.enabled = false" for name in LEFT_OUT),
        "",
        "[[operations]]",
        'include-path = "/v1/pipelines"',
        'include-method = "POST"',
        "checks.positive_data_acceptance.enabled = false",
        "",
    ]
)


@pytest_asyncio.fixture(scope="module")
async def door(
    env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Door]:
    tmp = tmp_path_factory.mktemp("openapi")
    async with door_stack(env.client, tmp / "stack") as stack:
        settings = stack.settings
        environ = worker_env(stack.client, settings, tmp / "data") | write_config(tmp)
        # schemathesis sends thousands of requests: the rate limit would answer most 429
        environ["AIWORKER_SERVE_RATE_LIMIT"] = "1000000/min"
        async with running_door(environ, tmp / "serve.log") as d:
            yield d


def schemathesis(door: Door, folder: Path, *headers: str) -> subprocess.CompletedProcess[str]:
    """``st run`` against the door's own document, as a process (its exit code: 0 when
    every check held)."""
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{door.url}/openapi.json"]
    cmd += ["--seed", str(SEED), "--max-examples", str(EXAMPLES)]
    cmd += ["--workers", "1", "--no-shrink", "--request-timeout", "70"]
    cmd += ["--phases", "examples,coverage,fuzzing"]
    cmd += ["--suppress-health-check", "all", "--continue-on-failure"]
    config = folder / "schemathesis.toml"
    config.write_text(CONFIG)
    cmd[3:3] = ["--config-file", str(config)]
    for header in headers:
        cmd += ["--header", header]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["NO_COLOR"] = "1"
    return subprocess.run(
        cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=170, check=False
    )


@pytest.mark.parametrize("with_key", [True, False], ids=["with-key", "without-key"])
async def test_the_server_answers_as_its_openapi_document_says(
    door: Door, tmp_path: Path, with_key: bool
) -> None:
    headers = [f"Authorization: Bearer {KEYS['ci'][1]}"] if with_key else []
    done = await asyncio.to_thread(schemathesis, door, tmp_path, *headers)
    assert done.returncode == 0, done.stdout[-20_000:] + done.stderr[-5_000:]
    # every operation was tried, and the checks ran
    assert "Tested: 13" in done.stdout and " passed" in done.stdout, done.stdout[-5_000:]
