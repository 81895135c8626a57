"""An attempt whose worker process is killed mid-call is booked at its maximum.

A real ``aiworker worker`` process serves an ``llm-call`` step (streamed)
against a loopback OpenAI-compatible server. The server holds the first
request until the test has killed that process with SIGKILL, then streams its
reply slowly into the dead connection, counting what it generated. The lost
attempt never reports its usage and sent no heartbeat; Temporal times it out
(start-to-close, a short step timeout) and a second worker process takes the
retry, which the server answers in full. The pipeline's ledger (its result's
``usage``) must count at least what the provider billed for both attempts,
and the step says that its usage was estimated. On a build without the
estimate the ledger holds the second attempt alone.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import history
from support.loopback import Exchange, serve
from support.pipelines import lost_call_pipeline
from support.procs import WorkerProcess, worker_env
from support.waiting import wait_until
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.client import start_pipeline

AIWORKER = str(Path(sys.executable).parent / "aiworker")
MAX_TOKENS = 200
ANSWER = ["Tea ", "brews ", "cooler ", "up ", "high."]
# The lost attempt's reply: at most this many pieces, one every PIECE_SECONDS.
LOST_PIECES = 40
PIECE_SECONDS = 0.05


def sse(doc: Any) -> bytes:
    return f"data: {doc if isinstance(doc, str) else json.dumps(doc)}\n\n".encode()


def prompt_tokens(body: dict[str, Any]) -> int:
    """What the server bills for a prompt: a token per four characters."""
    return max(1, sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4)


class SlowProvider:
    """Holds the first request until ``killed``, then streams slowly into it; answers
    the others at once. ``billed`` is what it billed per request (input, output)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.billed: list[list[int]] = []
        self.first = threading.Event()
        self.killed = threading.Event()

    def handle(self, ex: Exchange) -> None:
        if not ex.path.startswith("/v1/chat/completions"):
            return ex.send(404, b"", None)
        body = ex.json()
        with self.lock:
            n = len(self.billed)
            self.billed.append([prompt_tokens(body), 0])
        if n == 0:
            self.first.set()
            while not (self.killed.is_set() or ex.stopping.is_set()):
                self.killed.wait(0.05)
        ex.stream(200, self._reply(body, n), "text/event-stream")

    def _reply(self, body: dict[str, Any], n: int) -> Iterator[bytes]:
        base = {"id": f"c{n}", "object": "chat.completion.chunk", "model": body["model"]}
        pieces = ANSWER if n else ["more "] * LOST_PIECES
        for piece in pieces:
            with self.lock:
                self.billed[n][1] += 1  # generated, whoever reads it
            delta = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            yield sse({**base, "choices": [delta]})
            if n == 0:
                self.killed.wait(PIECE_SECONDS)  # set: a plain pause between pieces
        yield sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        usage = {"prompt_tokens": self.billed[n][0], "completion_tokens": len(pieces)}
        yield sse({**base, "choices": [], "usage": usage})
        yield sse("[DONE]")


@pytest.mark.timeout(240)
async def test_a_killed_attempts_usage_is_booked_at_its_maximum(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    provider = SlowProvider()
    with serve(provider.handle) as server:
        models = tmp_path / "models.json"
        models.write_text(
            json.dumps(
                {
                    "models": {
                        "slow": {
                            "provider": "openai",
                            "base_url": f"http://127.0.0.1:{server.port}/v1",
                            "model": "slow-model",
                        }
                    }
                }
            ),
            "utf-8",
        )
        env = worker_env(client, settings, tmp_path / "data")
        env["AIWORKER_MODELS_FILE"] = str(models)
        pipeline = lost_call_pipeline(
            "lost-usage",
            # start-to-close 3 s + grace: how long the lost attempt waits
            3,
            input={
                "model": "slow",
                "prompt": "Why does tea brew cooler up a mountain? One line.",
                "max_tokens": MAX_TOKENS,
                "stream": True,
            },
        )
        first = WorkerProcess([AIWORKER, "worker"], env, tmp_path / "worker-1.log")
        second: WorkerProcess | None = None
        try:
            started = await start_pipeline(client, settings, pipeline)
            handle = client.get_workflow_handle(started.id, result_type=PipelineResult)
            await wait_until(
                provider.first.is_set,
                lambda: f"the first attempt's request\n{first.output()}",
                timeout=90,
            )
            assert first.kill() == -signal.SIGKILL
            provider.killed.set()
            second = WorkerProcess([AIWORKER, "worker"], env, tmp_path / "worker-2.log")
            try:
                result = await asyncio.wait_for(handle.result(), 120)
            except TimeoutError:
                raise AssertionError(f"pipeline did not finish:\n{second.output()}") from None
            await wait_until(
                lambda: provider.billed[0][1] > 0, "the lost attempt's reply generated"
            )
        finally:
            first.close()
            if second is not None:
                second.terminate()
                second.close()

    assert result.status == "succeeded", result
    step = result.steps["ask"]
    assert step.attempts == 2
    assert step.outputs is not None and step.outputs["text"] == "".join(ANSWER)
    assert len(provider.billed) == 2
    (lost_in, lost_out), (ok_in, ok_out) = provider.billed
    assert (ok_in, ok_out) == (lost_in, len(ANSWER))
    # The ledger counts at least what the provider billed for both attempts.
    used = result.usage
    billed = lost_in + lost_out + ok_in + ok_out
    assert used.input_tokens + used.output_tokens >= billed, (used, provider.billed)
    assert used.output_tokens >= lost_out + ok_out
    assert used.input_tokens >= lost_in + ok_in
    # ... booked at the lost attempt's maximum: max_tokens plus the prompt estimate
    assert used.output_tokens == MAX_TOKENS + ok_out
    assert used.external_calls == 2
    assert [w["code"] for w in step.warnings] == ["usage_estimated"]
    assert step.warnings[0]["message"].startswith("usage estimated: attempt outcome unknown")
    assert await history.workflow_task_failures(handle) == 0
