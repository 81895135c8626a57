"""The step cache (``cache: {"ttl_seconds": N}``) through the real pipeline, the
real worker runtime and a real Temporal server: a second run reuses the
first's result, a changed input or another tenant misses, an entry past its
TTL misses, for_each items, fallbacks and the validation loop are keyed per
call, and a side-effecting worker refuses a cache before anything runs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, installed_workers, running_stack
from support import cache_workers
from support.loopback import upstream
from support.pipelines import refused
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client

from aiworker.activities.tools import scrape_tools
from aiworker.config.settings import Settings
from aiworker.workers.cli import main as cli

CALLS = cache_workers.CALLS
REFUSAL = (
    "step 'save': field 'cache': worker 'publish' has side effects "
    '("side_effects": true in its spec): a cached result would skip them; remove "cache"'
)


@pytest_asyncio.fixture
async def cache_stack(client: Client, settings: Settings) -> AsyncIterator[Stack]:
    """Built-ins plus the counting test workers of ``support.cache_workers``."""
    with_module = settings.model_copy(update={"worker_modules": ("support.cache_workers",)})
    with installed_workers(with_module) as workers:
        async with running_stack(client, with_module, workers=workers) as stack:
            yield stack


def _tenant() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def _echo_pipeline(tenant: str, text: str, ttl: int = 300, **step: Any) -> dict[str, Any]:
    return {
        "name": "cached",
        "tenant": tenant,
        "inputs": {"text": text},
        "steps": [
            {
                "id": "echo",
                "worker": "cache-echo",
                "input": {"text": "${{ inputs.text }}"},
                "cache": {"ttl_seconds": ttl},
                **step,
            },
            {
                "id": "check",
                "worker": "validator",
                "input": {
                    "data": "${{ steps.echo.outputs }}",
                    "schema": {"type": "object", "required": ["reply"]},
                },
            },
        ],
        "output": {"reply": "${{ steps.echo.outputs.reply }}"},
    }


async def _run(stack: Stack, pipeline: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    handle = await stack.start(pipeline)
    result = await handle.result()
    progress = await handle.query("progress")
    progress["details"] = (
        await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    ).current_details
    return result, progress


async def test_a_second_run_reuses_the_result_and_progress_says_cached(
    cache_stack: Stack,
) -> None:
    tenant = _tenant()
    first, _ = await _run(cache_stack, _echo_pipeline(tenant, "hello"))
    second, progress = await _run(cache_stack, _echo_pipeline(tenant, "hello"))
    changed, _ = await _run(cache_stack, _echo_pipeline(tenant, "hello again"))
    assert first.status == second.status == changed.status == "succeeded", second
    assert first.steps["echo"].cached is False
    assert second.steps["echo"].cached is True
    assert progress["steps"]["echo"]["cached"] is True
    assert progress["steps"]["check"]["cached"] is False  # no cache declared
    # the Temporal UI's step list marks the cached step, and only it
    assert "- **echo** · cache-echo · succeeded (cached) · " in progress["details"]
    assert "- **check** · validator · succeeded · " in progress["details"]
    # downstream references read the cached outputs as they read fresh ones
    assert second.output == first.output == {"reply": "hello"}
    assert second.steps["check"].outputs == first.steps["check"].outputs
    # the worker ran once for "hello", once for the changed input
    assert CALLS[f"cache-echo:{tenant}:hello"] == 1
    assert changed.steps["echo"].cached is False
    assert CALLS[f"cache-echo:{tenant}:hello again"] == 1
    # the entries live beside the artifacts, under the tenant
    entries = list((cache_stack.settings.data_dir / "cache" / tenant).glob("*/*.json"))
    assert len(entries) == 2


async def test_another_tenant_misses(cache_stack: Stack) -> None:
    a, b = _tenant(), _tenant()
    for tenant in (a, b, a):
        result, _ = await _run(cache_stack, _echo_pipeline(tenant, "shared text"))
        assert result.status == "succeeded"
    assert CALLS[f"cache-echo:{a}:shared text"] == 1
    assert CALLS[f"cache-echo:{b}:shared text"] == 1
    assert result.steps["echo"].cached is True  # a's second run


async def test_an_entry_past_its_ttl_misses(cache_stack: Stack) -> None:
    tenant = _tenant()
    first, _ = await _run(cache_stack, _echo_pipeline(tenant, "brief", ttl=1))
    # the cache's clock moves 2 s ahead (injected, no sleep): the 1 s entry is stale
    cache = cache_stack.runtime.cache
    cache.clock = lambda: time.time() + 2
    second, _ = await _run(cache_stack, _echo_pipeline(tenant, "brief", ttl=1))
    assert first.steps["echo"].cached is second.steps["echo"].cached is False
    assert CALLS[f"cache-echo:{tenant}:brief"] == 2
    # ... and the miss stored the result again: a longer TTL now hits it
    third, _ = await _run(cache_stack, _echo_pipeline(tenant, "brief", ttl=60))
    assert third.steps["echo"].cached is True
    assert CALLS[f"cache-echo:{tenant}:brief"] == 2


async def test_the_validation_retry_is_keyed_by_its_feedback(cache_stack: Stack) -> None:
    """The first output fails validation: the retry carries the reasons in its
    input, so it is never served the rejected output; a second run replays both
    attempts from the cache."""
    tenant = _tenant()
    validate = {
        "validate": {
            "schema": {"type": "object", "properties": {"reply": {"pattern": "fixed"}}},
            "max_attempts": 2,
        }
    }
    first, _ = await _run(cache_stack, _echo_pipeline(tenant, "draft", **validate))
    assert first.steps["echo"].status == "succeeded", first.steps["echo"]
    assert first.output == {"reply": "draft (fixed)"}
    assert first.steps["echo"].validation_attempts == 2
    assert CALLS[f"cache-echo:{tenant}:draft"] == 2  # the retry was not a hit
    second, _ = await _run(cache_stack, _echo_pipeline(tenant, "draft", **validate))
    assert second.output == {"reply": "draft (fixed)"}
    assert second.steps["echo"].cached is True
    assert CALLS[f"cache-echo:{tenant}:draft"] == 2


async def test_a_fallback_is_cached_under_its_own_worker(cache_stack: Stack) -> None:
    tenant = _tenant()
    step = {"worker": "cache-gone", "fallback": "cache-echo"}
    first, _ = await _run(cache_stack, _echo_pipeline(tenant, "plan b", **step))
    second, _ = await _run(cache_stack, _echo_pipeline(tenant, "plan b", **step))
    assert first.steps["echo"].fallback_used and second.steps["echo"].fallback_used
    assert second.steps["echo"].cached is True
    assert second.output == {"reply": "plan b"}
    # failures are never stored: the primary ran both times
    assert CALLS[f"cache-gone:{tenant}:plan b"] == 2
    assert CALLS[f"cache-echo:{tenant}:plan b"] == 1


async def test_for_each_items_are_cached_one_by_one(cache_stack: Stack) -> None:
    tenant = _tenant()

    def pipeline(texts: list[str]) -> dict[str, Any]:
        return {
            "name": "cached-items",
            "tenant": tenant,
            "inputs": {"texts": texts},
            "steps": [
                {
                    "id": "each",
                    "worker": "cache-echo",
                    "for_each": "${{ inputs.texts }}",
                    "input": {"text": "${{ item }}"},
                    "cache": {"ttl_seconds": 300},
                }
            ],
            "output": {"items": "${{ steps.each.outputs.items }}"},
        }

    first, _ = await _run(cache_stack, pipeline(["a", "b"]))
    second, progress = await _run(cache_stack, pipeline(["a", "b"]))
    third, _ = await _run(cache_stack, pipeline(["a", "c"]))
    assert first.steps["each"].items == {"total": 2, "succeeded": 2, "failed": 0}
    assert second.steps["each"].items == {"total": 2, "succeeded": 2, "failed": 0, "cached": 2}
    assert second.steps["each"].cached is True
    assert progress["steps"]["each"]["cached"] is True
    assert second.output == first.output == {"items": [{"reply": "a"}, {"reply": "b"}]}
    assert third.steps["each"].items == {"total": 2, "succeeded": 2, "failed": 0, "cached": 1}
    assert third.steps["each"].cached is False
    assert [CALLS[f"cache-echo:{tenant}:{t}"] for t in "abc"] == [1, 1, 1]


async def test_a_cached_scrape_counts_no_external_call(client: Client, settings: Settings) -> None:
    """A real web-scrape against a loopback site: the hit neither fetches the page
    nor books an external call against the budget."""
    tenant = _tenant()
    tools = scrape_tools(settings)
    with upstream() as site:
        pipeline = {
            "name": "cached-scrape",
            "tenant": tenant,
            "budget": {"max_external_calls": 5},
            "steps": [
                {
                    "id": "page",
                    "worker": "web-scrape",
                    "input": {
                        "url": f"{site.base_url}/p",
                        "extraction_spec": {"fields": {"title": {"selector": "h1"}}},
                    },
                    "cache": {"ttl_seconds": 300},
                }
            ],
            "output": {"title": "${{ steps.page.outputs.data.title }}"},
        }
        async with running_stack(client, settings, tools=tools) as stack:
            first, _ = await _run(stack, pipeline)
            second, _ = await _run(stack, pipeline)
        hits = site.by_path["/p"]
    await tools["fetch_url"].aclose()
    assert first.status == second.status == "succeeded", second
    assert second.output == first.output == {"title": "/p"}
    assert hits == 1
    assert first.usage.external_calls >= 1
    assert second.steps["page"].cached is True
    assert second.usage.external_calls == 0
    assert second.steps["page"].usage.external_calls == 0


def _publish_pipeline(tmp: Path) -> dict[str, Any]:
    return {
        "name": "cached-publish",
        "tenant": "acme",
        "inputs": {"doc": {"title": "x"}},
        "steps": [
            {
                "id": "save",
                "worker": "publish",
                "input": {"sink": {"file": "cached.jsonl"}, "record": "${{ inputs.doc }}"},
                "cache": {"ttl_seconds": 60},
            }
        ],
    }


def test_check_refuses_a_cache_on_a_side_effecting_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_publish_pipeline(tmp_path)))
    assert cli.main(["check", str(path)]) == 2
    assert f"{path}: {REFUSAL}" in capsys.readouterr().out.splitlines()
    assert cli.main(["check", "--json", str(path)]) == 2
    [problem] = json.loads(capsys.readouterr().out)
    assert (problem["step"], problem["path"]) == ("save", "steps[0].cache")


async def test_a_pipeline_with_a_cached_publish_is_refused_at_start(
    stack: Stack, tmp_path: Path
) -> None:
    err, _ = await refused(stack, _publish_pipeline(tmp_path))
    assert err.type == "invalid_input"
    assert REFUSAL in str(err)
    assert not list(stack.settings.data_dir.rglob("cached.jsonl"))  # nothing ran


def test_the_ttl_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for ttl in (0, 30 * 24 * 3600 + 1):
        pipeline = _echo_pipeline("acme", "x", ttl=ttl)
        pipeline["steps"][0]["worker"] = "validator"
        pipeline["steps"][0]["input"] = {"data": 1, "schema": {}}
        path = tmp_path / "p.json"
        path.write_text(json.dumps(pipeline))
        assert cli.main(["check", str(path)]) == 2
        out = capsys.readouterr().out
        assert "step 'echo': field 'cache.ttl_seconds': must be" in out, out


def test_the_documented_example_checks(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "pipelines" / "cached.json"
    assert cli.main(["check", str(example)]) == 0
    assert "(2 steps)" in capsys.readouterr().out


# --- issue 31: answers made under an older spec, and hits re-checked -------------------


async def test_a_spec_changed_without_a_new_version_misses(
    client: Client, settings: Settings
) -> None:
    tenant = _tenant()
    for module in ("support.cache_workers", "support.cache_workers_revised"):
        with_module = settings.model_copy(update={"worker_modules": (module,)})
        with installed_workers(with_module) as workers:
            async with running_stack(client, with_module, workers=workers) as stack:
                result, _ = await _run(stack, _echo_pipeline(tenant, "spec"))
        assert result.status == "succeeded"
        assert result.steps["echo"].cached is False  # the revised spec is another key
    assert CALLS[f"cache-echo:{tenant}:spec"] == 2


async def test_a_hit_the_output_schema_refuses_is_a_miss(cache_stack: Stack) -> None:
    tenant = _tenant()
    await _run(cache_stack, _echo_pipeline(tenant, "kept"))
    # the entry's outputs no longer pass the output_schema (written by an older
    # spec, or damaged): the hit is refused, counted, and the worker runs
    (entry,) = (cache_stack.settings.data_dir / "cache" / tenant).glob("*/*.json")
    doc = json.loads(entry.read_text())
    doc["result"]["outputs"] = {"reply": 5}
    entry.write_text(json.dumps(doc))
    refused_before = cache_stack.runtime.cache.refused
    second, _ = await _run(cache_stack, _echo_pipeline(tenant, "kept"))
    assert second.status == "succeeded", second
    assert second.steps["echo"].cached is False
    assert second.output == {"reply": "kept"}
    assert CALLS[f"cache-echo:{tenant}:kept"] == 2
    assert cache_stack.runtime.cache.refused == refused_before + 1
    # the fresh result was stored again: a third run hits it
    third, _ = await _run(cache_stack, _echo_pipeline(tenant, "kept"))
    assert third.steps["echo"].cached is True
