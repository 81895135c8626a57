"""Streaming llm-call through the real worker runtime and a real pipeline on the
Temporal test server, against loopback OpenAI and Anthropic SSE servers that
misbehave on purpose (``fixtures/llm_fakes.py``): the reply folds as a plain
one would, the running attempt's heartbeat details carry the partial text (read
mid-stream through ``describe()``), a retry after a mid-stream failure starts
clean and books the failed attempt's usage once, and every broken stream ends
in a stable code with its reason and its usage.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from conftest import Stack, running_stack
from fixtures.llm_fakes import (  # noqa: F401  (fake: the module fixture)
    DROP_AFTER,
    GOOD,
    PERSON_SCHEMA,
    SLOW_TEXT,
    FakeProvider,
    fake,
    words,
)
from support.pipelines import pipeline_result
from support.waiting import wait_until
from temporalio.client import Client, WorkflowHandle

from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.llm import LanguageModel, load_registry
from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import PipelineResult
from aiworker.schemas.protocol import Usage
from aiworker.workers.client.progress import progress_line, stream_events
from aiworker.workers.client.waits import snapshot
from aiworker.workers.devstack.devserver import temporal_cli_path

OPENAI = (
    "echo",
    "slow",
    "drop-once",
    "no-done",
    "endless",
    "endless-slow",
    "endless-big",
    "truncated",
    "no-choices",
    "html",
    "malformed",
)
ANTHROPIC = ("echo", "slow", "drop-once", "error-event", "no-stop")


@pytest_asyncio.fixture
async def stack(
    tmp_path: Path, fake: FakeProvider, client: Client, settings: Settings
) -> AsyncIterator[tuple[Stack, str]]:
    """Workers whose language model knows one alias per scenario (``claude-`` for
    Anthropic's), each a fresh model name on the fake server (its own request count)."""
    uid = uuid.uuid4().hex[:10]
    models: dict[str, Any] = {
        s: {"provider": "openai", "base_url": fake.root + "/v1", "model": f"{s}@{uid}"}
        for s in OPENAI
    }
    models.update(
        {
            f"claude-{s}": {"provider": "anthropic", "base_url": fake.root, "model": f"{s}@{uid}-a"}
            for s in ANTHROPIC
        }
    )
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": models}))
    registry = load_registry(settings.model_copy(update={"models_file": path}), {})
    # A high threshold: failures on purpose must not open each other's breaker.
    lm = LanguageModel(registry, breakers=BreakerRegistry("provider", failure_threshold=100))
    try:
        async with running_stack(client, settings, tools={"language_model": lm}) as s:
            yield s, uid
    finally:
        await lm.aclose()


async def start(
    stack: Stack, worker_input: dict[str, Any], **step: Any
) -> WorkflowHandle[Any, Any]:
    pipeline = {
        "name": "stream",
        "tenant": "acme",
        "steps": [
            {"id": "ask", "worker": "llm-call", "input": {"stream": True, **worker_input}, **step}
        ],
        "output": {},
    }
    return await stack.start(pipeline)


async def run(stack: Stack, worker_input: dict[str, Any], **step: Any) -> PipelineResult:
    result: PipelineResult = await pipeline_result(await start(stack, worker_input, **step))
    return result


async def failure_usage(handle: WorkflowHandle[Any, Any], client: Client) -> Usage:
    """The usage the first attempt's failure carried (its ErrorInfo)."""
    history = await handle.fetch_history()
    (started,) = [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    payloads = started.last_failure.application_failure_info.details.payloads
    (info,) = await client.data_converter.decode(payloads)
    return Usage.model_validate(info["usage"])


async def test_openai_and_anthropic_streams_fold_into_the_reply_a_plain_call_gives(
    stack: tuple[Stack, str], fake: FakeProvider
) -> None:
    s, uid = stack
    openai, anthropic, structured = await asyncio.gather(
        run(s, {"model": "echo", "prompt": "hello there"}),
        run(s, {"model": "claude-echo", "prompt": "hello there"}),
        run(s, {"model": "claude-echo", "prompt": "who?", "response_schema": PERSON_SCHEMA}),
    )
    for result, out_tokens in ((openai, 3), (anthropic, 3)):
        step = result.steps["ask"]
        assert result.status == "succeeded", step
        assert step.outputs["text"] == "echo: hello there"
        assert step.outputs["finish_reason"] == "stop"
        assert step.outputs["usage"]["output_tokens"] == out_tokens
        assert step.usage.external_calls == 1
    assert anthropic.steps["ask"].outputs["usage"]["input_tokens"] == 11
    assert structured.steps["ask"].outputs["json"] == GOOD, structured.steps["ask"]
    sent = {r.path: r for r in fake.seen(f"echo@{uid}") + fake.seen(f"echo@{uid}-a")}
    chat = sent["/v1/chat/completions"]
    assert chat.body["stream"] is True
    assert chat.body["stream_options"] == {"include_usage": True}
    assert chat.headers["accept"] == "text/event-stream"
    assert sent["/v1/messages"].body["stream"] is True
    assert "stream_options" not in sent["/v1/messages"].body


async def test_describe_reads_the_partial_text_while_the_model_streams(
    stack: tuple[Stack, str], client: Client
) -> None:
    s, _ = stack
    handle = await start(s, {"model": "slow", "prompt": "how do I brew tea?"})
    seen: list[Any] = []

    async def partial() -> bool:
        snap = await snapshot(client, handle.id)
        stream = snap.streams.get("ask")
        if stream and 20 < stream["chars"] < len(SLOW_TEXT):
            seen.append(snap)
            return True
        return False

    await wait_until(partial, timeout=10, interval=0.2, what="partial text in the heartbeat")
    snap = seen[-1]
    stream = snap.streams["ask"]
    assert SLOW_TEXT.startswith(stream["partial_text"])
    assert stream["step"] == "ask" and stream["tokens"] >= 1
    assert stream["usage"]["external_calls"] == 1 and stream["usage"]["output_tokens"] >= 1
    # what `aiworker run` draws from it: the live line and the plain line
    line = progress_line("stream", snap, 1.5)
    assert f'ask: {stream["tokens"]} tokens "' in line, line
    assert "running: ask" not in line
    (plain,) = stream_events(None, snap)
    assert plain.startswith(f"ask: {stream['tokens']} tokens")
    # the raw describe() a client reads: the pending activity's heartbeat details
    desc = await handle.describe()
    (act,) = desc.raw_description.pending_activities
    (details,) = await client.data_converter.decode(act.heartbeat_details.payloads)
    assert set(details) == {
        "step",
        "partial_text",
        "chars",
        "tokens",
        "usage",
        "attempt",
        "final",
        "before",
    }
    assert (details["attempt"], details["final"]) == (1, False)
    # and the temporal CLI, as docs/streaming.md shows it
    described = await asyncio.to_thread(
        subprocess.run,
        [
            temporal_cli_path(),
            "workflow",
            "describe",
            "--workflow-id",
            handle.id,
            "--output",
            "json",
            "--address",
            client.service_client.config.target_host,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert described.returncode == 0, described.stderr
    (pending,) = json.loads(described.stdout)["pendingActivities"]
    assert pending["activityType"]["name"] == "llm-call"
    assert SLOW_TEXT.startswith(pending["heartbeatDetails"][0]["partial_text"])
    result: PipelineResult = await handle.result()
    step = result.steps["ask"]
    assert result.status == "succeeded", step
    assert step.outputs["text"] == SLOW_TEXT
    assert step.outputs["usage"]["output_tokens"] == len(words(SLOW_TEXT))


async def test_a_retry_after_a_mid_stream_failure_starts_clean_and_books_usage_once(
    stack: tuple[Stack, str], client: Client, fake: FakeProvider
) -> None:
    s, uid = stack
    prompt = "say it once and only once please"
    handles = [
        await start(s, {"model": model, "prompt": prompt})
        for model in ("drop-once", "claude-drop-once")
    ]
    results: list[PipelineResult] = await asyncio.gather(*(h.result() for h in handles))
    expected_text = "echo: " + prompt
    for result, handle in zip(results, handles, strict=True):
        step = result.steps["ask"]
        assert result.status == "succeeded", step
        assert step.attempts == 2
        # clean: the second attempt's text alone, not the first one's partial text again
        assert step.outputs["text"] == expected_text
        first = await failure_usage(handle, client)
        assert first.output_tokens == DROP_AFTER and first.external_calls == 1
        own = step.outputs["usage"]
        second = Usage(input_tokens=own["input_tokens"], output_tokens=own["output_tokens"])
        # the failed attempt's usage once, plus the second attempt's own, exactly
        assert step.usage == first + second + Usage(external_calls=1)
        assert result.usage == step.usage
    anthropic = results[1].steps["ask"]
    assert anthropic.usage == Usage(
        input_tokens=22, output_tokens=DROP_AFTER + len(words(expected_text)), external_calls=2
    )
    for model in (f"drop-once@{uid}", f"drop-once@{uid}-a"):
        one, two = fake.seen(model)
        assert one.body == two.body  # the retry asks afresh: no partial text carried over


async def test_bad_replies_end_in_a_stable_code_with_their_reason_and_usage(
    stack: tuple[Stack, str],
) -> None:
    s, _ = stack
    once = {"retry": {"max_attempts": 1}}
    cases: list[tuple[dict[str, Any], dict[str, Any], str, list[str]]] = [
        ({"model": "no-choices", "stream": False}, once, "upstream_error", ["choices"]),
        ({"model": "no-choices"}, once, "upstream_error", ["no choices"]),
        ({"model": "malformed", "stream": False}, once, "upstream_error", ["not JSON"]),
        ({"model": "truncated"}, once, "upstream_error", ["not JSON"]),
        ({"model": "html", "stream": False}, once, "upstream_error", ["text/html", "502 Bad"]),
        ({"model": "html"}, once, "upstream_error", ["text/html", "502 Bad"]),
        (
            {"model": "no-done", "prompt": "a b c d e f g"},
            once,
            "upstream_error",
            ["[DONE]", f"after {DROP_AFTER} tokens"],
        ),
        ({"model": "endless", "max_tokens": 40}, once, "upstream_error", ["max_tokens=40"]),
        ({"model": "endless-big"}, once, "upstream_error", ["8388608 bytes"]),
        (
            {"model": "endless-slow"},
            {**once, "timeout_seconds": 1.5},
            "timeout",
            ["did not reply within"],
        ),
        (
            {"model": "claude-error-event", "prompt": "a b c d e f g"},
            once,
            "upstream_error",
            ["overloaded_error: Overloaded", "after 3 tokens"],
        ),
        ({"model": "claude-no-stop"}, once, "upstream_error", ["message_stop"]),
    ]
    started = time.monotonic()
    results = await asyncio.gather(
        *(run(s, {"prompt": "go", **fields}, **step) for fields, step, _, _ in cases)
    )
    # the slowest case is the deadline one: nothing hangs past it
    assert time.monotonic() - started < 20
    for (fields, _, code, words_), result in zip(cases, results, strict=True):
        step = result.steps["ask"]
        assert (result.status, step.error_code) == ("failed", code), (fields, step)
        for w in words_:
            assert w in (step.error_message or ""), (fields, step.error_message)
        assert step.usage.external_calls == 1, (fields, step.usage)
        if fields["model"] not in ("html", "malformed", "truncated"):
            # the provider billed tokens before the failure: they are booked
            assert step.usage.input_tokens > 0, (fields, step.usage)
    by_model = {
        c[0]["model"] + str(c[0].get("stream", True)): r
        for c, r in zip(cases, results, strict=True)
    }
    assert by_model["no-doneTrue"].steps["ask"].usage.output_tokens == DROP_AFTER
    assert by_model["endlessTrue"].steps["ask"].usage.output_tokens > 40
    assert by_model["claude-error-eventTrue"].steps["ask"].usage == Usage(
        input_tokens=11, output_tokens=3, external_calls=1
    )


def test_a_stream_books_cached_tokens_as_a_plain_reply_does() -> None:
    """The usage a stream reports (OpenAI's last chunk, Anthropic's message_start)
    counts cached prompt tokens exactly as the non-streamed reply of each provider."""
    from fixtures.llm_fakes import CACHED_ANTHROPIC_USAGE, CACHED_OPENAI_USAGE

    from aiworker.activities.llm._progress import StreamProgress
    from aiworker.activities.llm._sse import Event
    from aiworker.activities.llm._stream import _AnthropicFold, _OpenAIFold

    openai = _OpenAIFold(StreamProgress())
    openai.feed(Event("", json.dumps({"choices": [{"delta": {"content": "hi"}}]})))
    openai.feed(Event("", json.dumps({"choices": [], "usage": CACHED_OPENAI_USAGE})))
    got = openai._usage()
    assert (got.input_tokens, got.output_tokens) == (2000, 300)
    assert (got.cached_input_tokens, got.cache_write_tokens) == (1500, 0)

    anthropic = _AnthropicFold(StreamProgress())
    start = {"type": "message_start", "message": {"model": "m", "usage": CACHED_ANTHROPIC_USAGE}}
    anthropic.feed(Event("message_start", json.dumps(start)))
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 7},
    }
    anthropic.feed(Event("message_delta", json.dumps(delta)))
    got = anthropic._usage()
    # every prompt token: 200 plain + 1500 read from the cache + 1000 written to it
    assert (got.input_tokens, got.output_tokens) == (2700, 7)
    assert (got.cached_input_tokens, got.cache_write_tokens) == (1500, 1000)
