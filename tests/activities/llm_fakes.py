"""Loopback model providers for the llm-call tests, misbehaving on purpose.

One ``ThreadingHTTPServer`` on 127.0.0.1 speaks both wire formats:
``POST /v1/chat/completions`` (OpenAI-compatible; base URL ``.../v1``) and
``POST /v1/messages`` (Anthropic; base URL is the root). The requested
model name picks the behaviour: ``<scenario>@<anything>``; each distinct
model name has its own request counter, so a test that suffixes its models
with a fresh id gets fresh "first request" behaviour. Replies are
deterministic and carry usage fields. The ``scripted`` scenario answers
with the replies a test queued for that model name (:meth:`FakeProvider.script`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GOOD = {"name": "Ada", "age": 36}
BAD = {"name": "Ada", "age": "thirty-six"}
PERSON_SCHEMA = {
    "type": "object",
    "required": ["name", "age"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "additionalProperties": False,
}
HANG_SECONDS = 4.0


@dataclass
class Recorded:
    path: str
    model: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class FakeProvider:
    """The running server and what it saw."""

    server: ThreadingHTTPServer
    thread: threading.Thread
    requests: list[Recorded] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    scripts: dict[str, list[str | int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def script(self, model: str, *replies: str | int) -> None:
        """What the ``scripted`` scenario answers ``model``'s n-th request with: a
        string is the reply's content (HTTP 200), an int an error status; the last
        one repeats."""
        with self.lock:
            self.scripts[model] = list(replies)

    @property
    def root(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def seen(self, model: str) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.model == model]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def _usage_openai(body: dict[str, Any], completion: int) -> dict[str, int]:
    chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
    return {
        "prompt_tokens": max(1, chars // 4),
        "completion_tokens": completion,
        "total_tokens": max(1, chars // 4) + completion,
    }


def _openai_reply(body: dict[str, Any], content: str, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": body["model"] + "-2024",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": _usage_openai(body, 7),
    }


def _last_user(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return str(users[-1]["content"]) if users else ""


class _Handler(BaseHTTPRequestHandler):
    fake: FakeProvider
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(raw)
        except OSError:
            # The client gave up (a hang test): nothing to answer.
            pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        model = str(body.get("model", ""))
        fake = self.fake
        with fake.lock:
            fake.requests.append(
                Recorded(self.path, model, body, {k.lower(): v for k, v in self.headers.items()})
            )
            n = fake.counts[model] = fake.counts.get(model, 0) + 1
            script = fake.scripts.get(model)
        scenario = model.split("@", 1)[0]
        if scenario == "scripted" and self.path.startswith("/v1/chat/completions"):
            self._scripted(script or ["(nothing scripted)"], body, n)
        elif self.path.startswith("/v1/chat/completions"):
            self._openai(scenario, body, n)
        elif self.path == "/v1/messages":
            self._anthropic(scenario, body, n)
        else:
            self._send(404, {"error": {"message": "no such route", "type": "not_found"}})

    def _scripted(self, script: list[str | int], body: dict[str, Any], n: int) -> None:
        reply = script[min(n, len(script)) - 1]
        if isinstance(reply, int):
            self._send(reply, {"error": {"message": f"scripted {reply}", "type": "server"}})
        else:
            self._send(200, _openai_reply(body, reply))

    def _openai(self, scenario: str, body: dict[str, Any], n: int) -> None:
        err = {"type": "invalid_request_error", "code": None}
        if scenario == "echo":
            self._send(200, _openai_reply(body, "echo: " + _last_user(body)))
        elif scenario == "json-ok":
            fenced = "```json\n" + json.dumps(GOOD) + "\n```"
            self._send(200, _openai_reply(body, fenced))
        elif scenario == "json-bad":
            self._send(200, _openai_reply(body, json.dumps(BAD)))
        elif scenario == "json-feedback":
            fixed = "rejected" in _last_user(body)
            self._send(200, _openai_reply(body, json.dumps(GOOD if fixed else BAD)))
        elif scenario == "ratelimit-once" and n == 1:
            self._send(
                429,
                {"error": {**err, "message": "Rate limit reached", "code": "rate_limit_exceeded"}},
                {"retry-after": "1"},
            )
        elif scenario == "ratelimit-ms-once" and n == 1:
            self._send(
                429,
                {"error": {**err, "message": "Rate limit reached"}},
                {"retry-after-ms": "300", "x-ratelimit-reset-requests": "6m0s"},
            )
        elif scenario == "fail-once" and n == 1:
            self._send(500, {"error": {"message": "The server had an error", "type": "server"}})
        elif scenario == "hang-once" and n == 1:
            time.sleep(HANG_SECONDS)
            self._send(200, _openai_reply(body, "too late"))
        elif scenario == "malformed":
            self._send(200, b'{"choices": [{"message": {"content": "x"')
        elif scenario == "not-openai":
            self._send(200, {"result": "hello"})
        elif scenario == "length":
            self._send(200, _openai_reply(body, '{"name": "Ad', finish="length"))
        elif scenario == "context":
            msg = (
                "This model's maximum context length is 8192 tokens. However, your messages "
                "resulted in 9000 tokens."
            )
            self._send(400, {"error": {**err, "message": msg, "code": "context_length_exceeded"}})
        elif scenario == "unauthorized":
            key = self.headers.get("authorization", "").removeprefix("Bearer ")
            # Echoes the key back, as some servers do: it must not reach the error.
            msg = f"Incorrect API key provided: {key}"
            self._send(401, {"error": {**err, "message": msg, "code": "invalid_api_key"}})
        elif scenario == "bad-request":
            self._send(400, {"error": {**err, "message": "temperature: out of range"}})
        elif scenario == "down":
            self._send(503, {"error": {"message": "overloaded", "type": "server"}})
        else:
            self._send(200, _openai_reply(body, "echo: " + _last_user(body)))

    def _anthropic(self, scenario: str, body: dict[str, Any], n: int) -> None:
        usage = {"input_tokens": 11, "output_tokens": 5}
        base = {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"]}
        if scenario == "overloaded-once" and n == 1:
            self._send(
                529,
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            )
        elif scenario == "ratelimit-once" and n == 1:
            reset = (datetime.now(UTC) + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
            self._send(
                429,
                {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
                {
                    "anthropic-ratelimit-requests-remaining": "0",
                    "anthropic-ratelimit-requests-reset": reset,
                    "anthropic-ratelimit-tokens-remaining": "5000",
                    "anthropic-ratelimit-tokens-reset": "2030-01-01T00:00:00Z",
                },
            )
        elif "tools" in body:
            tool = body["tools"][0]["name"]
            content = [{"type": "tool_use", "id": "toolu_1", "name": tool, "input": GOOD}]
            self._send(200, {**base, "content": content, "stop_reason": "tool_use", "usage": usage})
        else:
            text = "echo: " + _last_user(body)
            content = [{"type": "text", "text": text}]
            self._send(200, {**base, "content": content, "stop_reason": "end_turn", "usage": usage})


def start_fake_provider() -> FakeProvider:
    """Start the server on an ephemeral loopback port."""
    handler = type("Handler", (_Handler,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="fake-llm", daemon=True)
    fake = FakeProvider(server, thread)
    handler.fake = fake  # type: ignore[attr-defined]
    thread.start()
    return fake
