"""A call whose last attempt the server timed out books its lost attempts at
their maximum (``lost-attempt-usage``): the ledger never counts them as zero.

A same-name stand-in for ``llm-call`` whose attempts never end (as when their
worker process is lost): the first heartbeats what it has consumed so far,
marked as running, the second heartbeats nothing. Both are timed out by the
server (a one-second step timeout plus the start-to-close grace). The step
fails with ``timeout``; its usage and the pipeline's are what the first
attempt heartbeated, raised to the most one attempt may consume (the tokens
the budget reserved for the call, its one external call, and its prompt at one
token per byte of its input), plus that maximum again for the second; the
step says the usage was estimated.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import running_stack
from support import history
from support.pipelines import lost_call_pipeline, pipeline_result
from support.standins import never_ends
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas import names

HEARD = {"input_tokens": 30, "output_tokens": 10, "external_calls": 1}
SPEC_MAX_TOKENS = 1500  # llm-call's spec cap: the budget's share for one call


def first_attempt_beats(attempt: int) -> dict[str, Any] | None:
    if attempt != 1:
        return None
    return {"usage": HEARD, "attempt": 1, "final": False, "before": {}}


LOST = lost_call_pipeline("lost-usage", 1, retry={"max_attempts": 2})


@pytest.mark.timeout(90)
async def test_a_timed_out_last_attempt_is_booked_at_its_maximum(
    client: Client, settings: Settings
) -> None:
    act = never_ends(names.LLM_CALL, first_attempt_beats)
    async with running_stack(client, settings, replace_activities={names.LLM_CALL: act}) as s:
        handle = await s.start(LOST)
        result = await pipeline_result(handle)
    step = result.steps["ask"]
    assert (result.status, step.error_code, step.attempts) == ("failed", "timeout", 2)
    # the prompt's bound: one token per byte of the input (no tokenizer makes more)
    prompt = len(json.dumps(LOST["steps"][0]["input"]).encode())
    expected = (max(30, prompt) + prompt, SPEC_MAX_TOKENS * 2, 2)
    for usage in (step.usage, result.usage):
        assert (usage.input_tokens, usage.output_tokens, usage.external_calls) == expected
    (warning,) = step.warnings
    assert warning["code"] == "usage_estimated"
    assert warning["message"].startswith("usage estimated: attempt outcome unknown (attempt 1, 2")
    assert await history.workflow_task_failures(handle) == 0
