"""Small leaks (issue 15, item 7, headers and redaction).

Each credential pattern the redactor knows; URLs lose userinfo and query
values; a failing webhook publish whose URL holds a token and a password
leaves neither in the step's error or in history; a user agent with control
characters is ``invalid_input``, sends nothing and leaves the host's breaker
as it was.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from hypothesis import given, settings
from hypothesis import strategies as st
from support.loopback import Exchange, serve
from support.payloads import stack_settings
from support.pipelines import pipeline_result
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.publish import WebhookPoster
from aiworker.activities.redaction import Redactor, redact_patterns
from aiworker.activities.tools import scrape_tools
from aiworker.config.settings import Settings, parse_rate_limits
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.process.logs import JsonFormatter

# (text, what must be gone, what must stay)
PATTERNS = [
    ("GET https://h.test/x?access_token=at-123456&page=2", "at-123456", "page=…"),
    ("access_token=at-123456&page=2", "at-123456", "page=2"),
    ('{"refresh_token": "rt-abcdef"}', "rt-abcdef", '"refresh_token": "[REDACTED]"'),
    ("password=hunter2 then", "hunter2", "then"),
    ("login with passwd: pa55 ok", "pa55", "ok"),
    ('{"password": "p"}', '"p"', '"password"'),
    ("Cookie: sid=s3ss10n; theme=dark\nnext line", "s3ss10n", "next line"),
    ("set-cookie: id=a3fWa; Expires=Thu, 21 Oct 2021", "a3fWa", "set-cookie: [REDACTED]"),
    ("X-Auth-Token: xat-98765", "xat-98765", "X-Auth-Token: [REDACTED]"),
    ("x-api-key: k-42", "k-42", "x-api-key"),
    ("api_key=ak-1&q=shoes", "ak-1", "q=shoes"),
    ("Authorization: Bearer abcdef123456", "abcdef123456", "Authorization: [REDACTED]"),
    ("authorization=Basic dXNlcjpwYXNz", "dXNlcjpwYXNz", "authorization=[REDACTED]"),
    ("Proxy-Authorization: Digest abcdef", "abcdef", "Proxy-Authorization"),
    ('{"Authorization": "token gh-xyz"}', "gh-xyz", '"Authorization": "[REDACTED]"'),
    ("sent Bearer tok_1234567890", "tok_1234567890", "sent Bearer [REDACTED]"),
    ("client_secret=cs-777", "cs-777", "client_secret=[REDACTED]"),
    ("token: tk-1", "tk-1", "token: [REDACTED]"),
    (
        "webhook https://user:pw-9@hooks.test/hook?token=abc&x=1 failed",
        "pw-9",
        "webhook https://hooks.test/hook?token=…&x=… failed",
    ),
    ("see https://h.test/p?apikey=K9#access_token=F7 now", "K9", "https://h.test/p?apikey=…#"),
    ("redis://:dbpass@cache:6379/0", "dbpass", "redis://cache:6379/0"),
    ("https://h.test/plain/path", "\0", "https://h.test/plain/path"),
]


@pytest.mark.parametrize(("text", "gone", "kept"), PATTERNS)
def test_each_credential_pattern(text: str, gone: str, kept: str) -> None:
    out = Redactor()(text)
    assert gone not in out and kept in out, out


def test_ordinary_words_stay() -> None:
    text = "max_tokens=5 input_tokens: 7 the bearer of news; a password_field x"
    assert Redactor()(text) == text


def test_log_lines_lose_url_credentials() -> None:
    fmt = JsonFormatter(Redactor())
    record = logging.getLogger("aiworker.test").makeRecord(
        "aiworker.test",
        logging.WARNING,
        __file__,
        1,
        "posting to %s",
        ("https://u:pw-LOG@hooks.test/h?sig=SIG-LOG",),
        None,
        extra={"aiworker": {"url": "http://a:b-FIELD@x.test/?k=V-FIELD"}},
    )
    line = fmt.format(record)
    for leaked in ("pw-LOG", "SIG-LOG", "b-FIELD", "V-FIELD"):
        assert leaked not in line
    assert json.loads(line)["event"] == "posting to https://hooks.test/h?sig=…"


def _history_without_inputs(events: Any) -> str:
    """Every event but those that carry the pipeline's own input (which holds the URL)."""
    carry_input = {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
    }
    return "\n".join(str(e) for e in events if e.event_type not in carry_input)


async def test_a_failing_webhook_keeps_its_credentials_out_of_history(
    client: Client, settings: Settings
) -> None:
    def down(ex: Exchange) -> None:
        ex.body()
        ex.send(503, b"", None)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # nobody listens once the block ends
    poster = WebhookPoster(settings)
    try:
        with serve(down) as hook:
            said_503 = f"http://hookuser:pw-SECRET1@127.0.0.1:{hook.port}/h?token=tok-SECRET2&x=1"
            refused = f"http://hookuser:pw-SECRET3@127.0.0.1:{closed_port}/h?token=tok-SECRET4"
            steps = [
                {
                    "id": sid,
                    "worker": "publish",
                    "input": {"sink": {"webhook": url}, "record": {"a": 1}},
                    "retry": {"max_attempts": 1},
                    "on_failure": "continue",
                }
                for sid, url in (("said_503", said_503), ("refused", refused))
            ]
            async with running_stack(client, settings, tools={"http_post": poster}) as stack:
                handle = await stack.start({"name": "hook", "tenant": "acme", "steps": steps})
                result: PipelineResult = await pipeline_result(handle)
                history = await handle.fetch_history()
    finally:
        await poster.aclose()
    s = result.steps
    assert (s["said_503"].error_code, s["refused"].error_code) == ("fetch_failed", "fetch_failed")
    assert f"http://127.0.0.1:{hook.port}/h?token=…&x=…" in (s["said_503"].error_message or "")
    assert "503" in (s["said_503"].error_message or "")
    assert "cannot connect" in (s["refused"].error_message or "")
    seen = _history_without_inputs(history.events) + json.dumps(result.model_dump(mode="json"))
    assert "fetch_failed" in seen
    for secret in ("SECRET1", "SECRET2", "SECRET3", "SECRET4", "hookuser"):
        assert secret not in seen, secret


@pytest.mark.parametrize("ua", ["bot/1.0\r\nX-Evil: 1", "bot\n", "bot\x00", "b\u00f6t/1"])
async def test_a_user_agent_with_control_characters_is_invalid_input_and_no_host_failure(
    client: Client, tmp_path: Path, ua: str
) -> None:
    hits: list[str] = []

    def site(ex: Exchange) -> None:
        hits.append(ex.target)
        ex.send(200, b"<html><h1>x</h1></html>")

    settings = stack_settings(
        tmp_path, rate_limits=tuple(parse_rate_limits("web-scrape:*=100000/min"))
    )
    # One failure would open it: any failure counted for the host shows.
    breakers = BreakerRegistry("host", failure_threshold=1, open_seconds=60)
    tools = scrape_tools(settings, breakers=breakers)
    try:
        with serve(site) as server:
            async with running_stack(client, settings, tools=tools) as stack:
                handle = await stack.start(
                    {
                        "name": "ua",
                        "tenant": "acme",
                        "steps": [
                            {
                                "id": "scrape",
                                "worker": "web-scrape",
                                "input": {
                                    "url": server.url("/page"),
                                    "user_agent": ua,
                                    "extraction_spec": {"fields": {"h1": "h1"}},
                                },
                            }
                        ],
                    }
                )
                result: PipelineResult = await pipeline_result(handle)
                state = breakers.state(f"127.0.0.1:{server.port}")
    finally:
        await tools["fetch_url"].aclose()
    step = result.steps["scrape"]
    assert (step.error_code, step.attempts) == ("invalid_input", 1)
    assert "input.user_agent" in (step.error_message or "")
    assert hits == []  # not even robots.txt
    assert state == "closed"


def test_redaction_is_idempotent() -> None:
    # The formatter redacts each value and then the whole JSON line again.
    r = Redactor()
    once = r("https://u:p@h.test/x?a=1 password=abc Cookie: a=b")
    assert r(once) == once


# Pieces of what the patterns look for, their separators, and text that lowercases
# differently from what (?i) matches (the Kelvin sign, the long s, dotted I).
# fmt: off
_PIECES = [
    "auth", "Authorization", "Proxy-", "x-api-key", "api", "_key", "key", "apikey",
    "token", "TOKEN", "access_", "Id", "passwd", "PassWord", "pwd", "client-", "secret",
    "Set-", "cookie", "COOKIE", "Bearer", " bearer ", "Basic ", "https://", "redis://",
    "://", "user:pw@", "h.test", "/p", "?", "&", "=", ":", ": ", " ", "\"", "'", "#",
    ";", ",", "<", "abc123xyz", "x", "\n", "\r", "é", "\u212a", "\u017f", "\u0130",
    "…", "[REDACTED]",
]
# fmt: on


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=24).map("".join))
def test_the_pattern_shortcuts_change_nothing(text: str) -> None:
    # The redactor skips a pattern whose words are not in the text: the same result
    # as every pattern run on every text.
    assert Redactor()(text) == redact_patterns(text)
