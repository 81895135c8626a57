"""The publish worker: file and webhook sinks, exactly once per idempotency key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.loopback import Exchange, serve
from temporalio.exceptions import ApplicationError

from aiworker.activities.publish import Publish, WebhookPoster
from aiworker.activities.publish_ledger import Ledger
from aiworker.activities.runtime import WorkerRuntime
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas.protocol import WorkerResponse


async def _publish(
    settings: Settings, key: str, sink: dict[str, Any], record: Any, tenant: str = "acme"
) -> WorkerResponse:
    request = {
        "worker_id": "publish",
        "idempotency_key": key,
        "tenant": tenant,
        "input": {"sink": sink, "record": record},
    }
    poster = WebhookPoster(settings)
    try:
        runtime = WorkerRuntime(settings, load_specs(), tools={"http_post": poster})
        return await runtime.run(Publish(), request)
    finally:
        await poster.aclose()


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


async def test_file_sink_appends_once_per_key(settings: Settings) -> None:
    sink = {"file": "out/products.jsonl"}
    first = await _publish(settings, "wf/notify", sink, {"title": "Mug"})
    again = await _publish(settings, "wf/notify", sink, {"title": "Mug"})
    other = await _publish(settings, "wf/notify/1", sink, {"title": "Cup"})
    assert first.outputs["published"] is True and first.outputs["duplicate"] is False
    assert again.outputs == {**first.outputs, "published": False, "duplicate": True}
    assert other.outputs["published"] is True
    lines = _lines(settings.data_dir / "sinks" / "acme" / "out" / "products.jsonl")
    assert [(x["idempotency_key"], x["record"]) for x in lines] == [
        ("wf/notify", {"title": "Mug"}),
        ("wf/notify/1", {"title": "Cup"}),
    ]
    assert lines[0]["tenant"] == "acme"


@pytest.mark.parametrize("path", ["../escape.jsonl", "/etc/passwd", "a/../../b.jsonl", "."])
async def test_file_sink_outside_the_data_dir_is_invalid_input(
    settings: Settings, path: str
) -> None:
    with pytest.raises(ApplicationError) as e:
        await _publish(settings, "wf/x", {"file": path}, {})
    assert e.value.type == "invalid_input"
    assert e.value.non_retryable


async def test_file_sinks_live_under_the_tenant_and_keys_are_per_tenant(
    settings: Settings,
) -> None:
    sink = {"file": "orders.jsonl"}
    acme = await _publish(settings, "wf/p", sink, {"n": 1})
    # the same key and file name for another tenant is another side effect
    globex = await _publish(settings, "wf/p", sink, {"n": 2}, tenant="globex")
    assert acme.outputs["published"] is True and globex.outputs["published"] is True
    sinks = settings.data_dir / "sinks"
    assert [x["record"] for x in _lines(sinks / "acme" / "orders.jsonl")] == [{"n": 1}]
    assert [x["record"] for x in _lines(sinks / "globex" / "orders.jsonl")] == [{"n": 2}]
    assert not (sinks / "orders.jsonl").exists()
    # one tenant cannot climb into another's directory
    with pytest.raises(ApplicationError) as e:
        await _publish(settings, "wf/q", {"file": "../globex/orders.jsonl"}, {"n": 3})
    assert e.value.type == "invalid_input"
    assert len(_lines(sinks / "globex" / "orders.jsonl")) == 1


async def test_a_key_reused_with_another_sink_is_invalid_input(
    settings: Settings, hook: tuple[str, _Hook]
) -> None:
    url, state = hook
    first = await _publish(settings, "wf/once", {"file": "a.jsonl"}, {"n": 1})
    assert first.outputs["published"] is True
    # the same file spelled differently is the same sink
    again = await _publish(settings, "wf/once", {"file": "./x/../a.jsonl"}, {"n": 1})
    assert again.outputs["duplicate"] is True
    for other in ({"file": "b.jsonl"}, {"webhook": url}):
        with pytest.raises(ApplicationError) as e:
            await _publish(settings, "wf/once", other, {"n": 1})
        assert (e.value.type, e.value.non_retryable) == ("invalid_input", True)
        message = str(e.value)
        assert "file:a.jsonl" in message and ("file:b.jsonl" in message or url in message)
    assert state.requests == []
    assert not (settings.data_dir / "sinks" / "acme" / "b.jsonl").exists()
    # a webhook key, then a file sink
    await _publish(settings, "wf/hooked", {"webhook": url}, {"n": 1})
    with pytest.raises(ApplicationError) as e:
        await _publish(settings, "wf/hooked", {"file": "a.jsonl"}, {"n": 1})
    assert e.value.type == "invalid_input" and url in str(e.value)
    assert len(_lines(settings.data_dir / "sinks" / "acme" / "a.jsonl")) == 1


def _long_name() -> str:
    # 6 components of 80 three-byte characters: 486 characters (the schema's cap
    # is 512), 1446 bytes (over the 1024-byte cap), each component 240 bytes
    return "/".join(["€" * 80] * 6)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("sub/", "is a directory"),
        ("existing", "is a directory"),
        ("nul\x00.jsonl", "NUL"),
        ("a" * 256 + ".jsonl", "component"),
        ("d/" + "é" * 130, "component"),
        (_long_name(), "bytes; at most 1024"),
        ("plain.jsonl/under-a-file.jsonl", "cannot be a file"),
    ],
)
async def test_a_bad_sink_name_is_invalid_input_not_internal(
    settings: Settings, name: str, why: str
) -> None:
    (settings.data_dir / "sinks" / "acme" / "existing").mkdir(parents=True)
    await _publish(settings, "wf/plain", {"file": "plain.jsonl"}, {})
    with pytest.raises(ApplicationError) as e:
        await _publish(settings, "wf/bad", {"file": name}, {"n": 1})
    assert (e.value.type, e.value.non_retryable) == ("invalid_input", True)
    assert why in str(e.value)
    assert e.value.details[0]["field"] == "input.sink.file"


async def test_crash_after_append_before_ledger_done_does_not_append_twice(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_mark = Ledger.mark
    calls = {"n": 0}

    def dying_mark(
        conn: Any, tenant: str, key: str, sink: str, state: str, status_code: Any = None
    ) -> None:
        if state == "done" and calls["n"] == 0:
            calls["n"] += 1
            raise RuntimeError("process killed")
        real_mark(conn, tenant, key, sink, state, status_code)

    monkeypatch.setattr(Ledger, "mark", staticmethod(dying_mark))
    with pytest.raises(ApplicationError) as e:
        await _publish(settings, "wf/p", {"file": "s.jsonl"}, {"n": 1})
    assert e.value.type == "internal"
    retry = await _publish(settings, "wf/p", {"file": "s.jsonl"}, {"n": 1})
    assert retry.outputs["duplicate"] is True
    assert len(_lines(settings.data_dir / "sinks" / "acme" / "s.jsonl")) == 1


class _Hook:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.requests: list[tuple[dict[str, str], Any]] = []


@pytest.fixture
def hook() -> Iterator[tuple[str, _Hook]]:
    state = _Hook([])

    def handle(ex: Exchange) -> None:
        state.requests.append((dict(ex.headers), ex.json()))
        code = state.statuses.pop(0) if state.statuses else 200
        ex.send(code, b"", None, {"Retry-After": "7"} if code == 429 else None)

    with serve(handle) as server:
        yield server.url("/hook"), state


async def test_webhook_posts_with_idempotency_key_once(
    settings: Settings, hook: tuple[str, _Hook]
) -> None:
    url, state = hook
    first = await _publish(settings, "wf/hook", {"webhook": url}, {"a": 1})
    again = await _publish(settings, "wf/hook", {"webhook": url}, {"a": 1})
    assert first.outputs["published"] is True and first.outputs["status_code"] == 200
    assert first.usage.external_calls == 1
    assert again.outputs["duplicate"] is True and again.usage.external_calls == 0
    assert len(state.requests) == 1
    headers, body = state.requests[0]
    assert headers["Idempotency-Key"] == "wf/hook"
    assert body == {"idempotency_key": "wf/hook", "tenant": "acme", "record": {"a": 1}}


async def test_webhook_errors_map_to_codes(settings: Settings, hook: tuple[str, _Hook]) -> None:
    url, state = hook
    state.statuses = [503, 429, 403, 422]
    expected = [
        ("fetch_failed", False, None),
        ("rate_limited", False, 7.0),
        ("access_denied", True, None),
        ("invalid_input", True, None),
    ]
    for code, non_retryable, delay in expected:
        with pytest.raises(ApplicationError) as e:
            await _publish(settings, "wf/err", {"webhook": url}, {})
        assert (e.value.type, e.value.non_retryable) == (code, non_retryable)
        if delay is not None:
            assert e.value.next_retry_delay is not None
            assert e.value.next_retry_delay.total_seconds() == delay
    ok = await _publish(settings, "wf/err", {"webhook": url}, {})
    assert ok.outputs["published"] is True
    assert len(state.requests) == 5


async def test_webhook_to_loopback_is_denied_without_private_networks(
    settings: Settings, hook: tuple[str, _Hook]
) -> None:
    url, state = hook
    strict = settings.model_copy(update={"allow_private_networks": False})
    with pytest.raises(ApplicationError) as e:
        await _publish(strict, "wf/deny", {"webhook": url}, {})
    assert e.value.type == "egress_denied"
    assert state.requests == []
