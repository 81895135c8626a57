"""The live worker registry in Temporal (workflows/worker_registry.py,
workers/process/live_registry.py): processes publish with update-with-start, entries
expire when not refreshed and are withdrawn on a graceful stop, readers ignore
malformed entries with a warning naming the process, and a registry nobody runs
is a clear reason for the local fallback. Against the session's dev server; each
test on its own queue family, so its own registry workflow."""

from __future__ import annotations

import pytest
from conftest import running_stack
from module_workers import SPEC as WORD_COUNT
from support.registry import entry, publish_raw
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.live_registry import (
    REGISTRY_PROTOCOL,
    spec_hash,
)
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.workers.process.live_registry import (
    LiveRegistry,
    RegistryUnreadableError,
    process_entry,
    publishing,
    read_registry,
    resolve_view,
)
from aiworker.workflows.worker_registry import WorkerRegistryWorkflow


async def live(client: Client, settings: Settings) -> LiveRegistry:
    reg = await read_registry(client, settings.task_queue_suffix, secret=settings.registry_secret)
    assert reg is not None
    return reg


async def test_a_published_entry_is_read_back_and_withdrawn_on_stop(
    client: Client, settings: Settings
) -> None:
    assert (
        await read_registry(client, settings.task_queue_suffix, secret=settings.registry_secret)
        is None
    )
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        e = entry("p1@host", specs={"word-count": WORD_COUNT})
        async with publishing(client, settings, e) as pub:
            await wait_until(pub.published.is_set, "the first publish")
            reg = await live(client, settings)
            assert [p.identity for p in reg.processes] == ["p1@host"]
            assert reg.served() == {names.VALIDATOR, "word-count"}
            spec = reg.specs()["word-count"]
            assert spec.version == "1.0.0"
            wc = next(w for w in reg.processes[0].workers if w.worker_id == "word-count")
            assert wc.spec_hash == spec_hash(spec)
            assert reg.processes[0].build_id == "b1"
            view = await resolve_view(client, settings, dict)
            assert view.source == "live"
            assert view.describe() == "the live registry (1 process)"
        # withdrawn on the way out: the registry lists nobody, at once
        reg = await live(client, settings)
        assert reg.processes == ()
        view = await resolve_view(client, settings, lambda: load_specs())
        assert view.source == "local"
        assert view.reason == "the live registry lists no live worker process"


async def test_an_entry_not_refreshed_expires(client: Client, settings: Settings) -> None:
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        await publish_raw(
            client, settings, "gone@host", entry("gone@host").model_dump(mode="json"), ttl=1
        )
        await publish_raw(
            client, settings, "stays@host", entry("stays@host").model_dump(mode="json")
        )

        async def only_the_refreshed_one() -> bool:
            reg = await live(client, settings)
            return [p.identity for p in reg.processes] == ["stays@host"]

        await wait_until(only_the_refreshed_one, "the unrefreshed entry to expire", timeout=15)
        # the workflow's timer dropped it: its state no longer holds it
        handle = client.get_workflow_handle(
            names.worker_registry_workflow_id(settings.task_queue_suffix)
        )
        state = await handle.query(WorkerRegistryWorkflow.entries)
        assert set(state.records) == {"stays@host"}


async def test_malformed_and_other_major_entries_are_ignored_with_a_warning(
    client: Client, settings: Settings
) -> None:
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        good = entry("good@host").model_dump(mode="json")
        await publish_raw(client, settings, "good@host", good)
        await publish_raw(
            client, settings, "future@host", {**good, "identity": "future@host", "protocol": "2.0"}
        )
        await publish_raw(
            client,
            settings,
            "broken@host",
            {"protocol": REGISTRY_PROTOCOL, "identity": "broken@host", "workers": 7},
        )
        bad_spec = entry("badspec@host").model_dump(mode="json")
        bad_spec["workers"][0]["spec"]["constraints"] = {"timeout_seconds": "soon"}
        await publish_raw(client, settings, "badspec@host", bad_spec)
        reg = await live(client, settings)
    assert [p.identity for p in reg.processes] == ["good@host"]
    text = "\n".join(reg.warnings)
    assert len(reg.warnings) == 3, text
    assert "registry entry of process 'future@host': protocol '2.0'" in text
    assert "malformed registry entry of process 'broken@host'" in text
    assert "malformed registry entry of process 'badspec@host': worker 'validator'" in text


async def test_the_registry_refuses_a_bad_publish_without_running_it(
    client: Client, settings: Settings
) -> None:
    from temporalio.client import WorkflowUpdateFailedError

    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        with pytest.raises(WorkflowUpdateFailedError):
            await publish_raw(client, settings, "huge@host", {"blob": "x" * 1_100_000})


async def test_a_registry_nobody_runs_is_a_clear_reason_and_the_local_fallback(
    client: Client, settings: Settings
) -> None:
    # published (the workflow exists), but no worker polls the pipelines queue now
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        await publish_raw(client, settings, "p@host", entry("p@host").model_dump(mode="json"))
    with pytest.raises(RegistryUnreadableError, match=r"did not answer within 1s"):
        await read_registry(
            client, settings.task_queue_suffix, secret=settings.registry_secret, read_timeout=1
        )
    view = await resolve_view(client, settings, lambda: load_specs(), read_timeout=1)
    assert view.source == "local"
    assert view.describe().startswith("local specs (the live registry (aiworker-registry-")
    assert "did not answer within 1s" in view.describe()


async def test_the_live_view_checks_workers_and_model_aliases_from_the_registry(
    client: Client, settings: Settings
) -> None:
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        llm = process_entry(
            identity="llm@host",
            build_id="b1",
            task_queues=["aiworker-llm-x"],
            specs=dict(load_specs()),
            served={names.LLM_CALL},
            model_providers={"default": "openai", "claude": "anthropic"},
        )
        await publish_raw(client, settings, "llm@host", llm.model_dump(mode="json"))
        await publish_raw(
            client,
            settings,
            "wc@host",
            entry("wc@host", specs={"word-count": WORD_COUNT}).model_dump(mode="json"),
        )
        view = await resolve_view(client, settings, dict)
    assert view.source == "live"
    assert view.aliases == {"default", "claude"}
    ok = {
        "name": "wc",
        "steps": [{"id": "c", "worker": "word-count", "input": {"text": "a b"}}],
    }
    assert view.check(ok, settings).steps[0].worker == "word-count"
    with pytest.raises(PipelineSpecError) as bad_input:
        view.check(
            {**ok, "steps": [{"id": "c", "worker": "word-count", "input": {"txt": "a"}}]}, settings
        )
    assert "text" in str(bad_input.value)
    gpt5 = {
        "name": "m",
        "steps": [{"id": "ask", "worker": "llm-call", "input": {"prompt": "hi", "model": "gpt5"}}],
    }
    with pytest.raises(PipelineSpecError) as alias:
        view.check(gpt5, settings)
    assert "unknown model alias 'gpt5' (known: claude, default)" in str(alias.value)
    unknown = {"name": "u", "steps": [{"id": "x", "worker": "nobody", "input": {}}]}
    with pytest.raises(PipelineSpecError) as nobody:
        view.check(unknown, settings)
    assert "unknown worker 'nobody'" in str(nobody.value)
    assert "word-count" in str(nobody.value)


async def test_the_registry_continues_as_new_carrying_its_records(
    client: Client, settings: Settings
) -> None:
    workflow_id = names.worker_registry_workflow_id(settings.task_queue_suffix)
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        await publish_raw(
            client, settings, "quiet@host", entry("quiet@host").model_dump(mode="json")
        )
        first = (await client.get_workflow_handle(workflow_id).describe()).run_id
        busy = entry("busy@host").model_dump(mode="json")
        # each publish is a round of the workflow; past its count it continues as new
        for _ in range(260):
            await publish_raw(client, settings, "busy@host", busy)
        desc = await client.get_workflow_handle(workflow_id).describe()
        reg = await live(client, settings)
    assert desc.run_id != first, "the registry never continued as new"
    assert [p.identity for p in reg.processes] == ["busy@host", "quiet@host"]


async def test_a_registry_history_replays_in_the_default_sandbox(
    client: Client, settings: Settings
) -> None:
    from temporalio.worker import Replayer

    from aiworker.workers.client.temporal_client import data_converter

    workflow_id = names.worker_registry_workflow_id(settings.task_queue_suffix)
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        await publish_raw(
            client, settings, "a@host", entry("a@host").model_dump(mode="json"), ttl=1
        )
        await publish_raw(client, settings, "b@host", entry("b@host").model_dump(mode="json"))
        handle = client.get_workflow_handle(workflow_id)
        await handle.signal(WorkerRegistryWorkflow.withdraw, "b@host")

        async def empty() -> bool:
            return not (await handle.query(WorkerRegistryWorkflow.entries)).records

        await wait_until(empty, "a withdrawn and an expired entry gone")
        history = await handle.fetch_history()
    # publish, expiry timer, withdraw: the same decisions on replay, default sandbox
    result = await Replayer(
        workflows=[WorkerRegistryWorkflow], data_converter=data_converter(None)
    ).replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    kinds = {e.event_type for e in history.events}
    assert EventType.EVENT_TYPE_TIMER_FIRED in kinds
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED in kinds
