"""Trust in the live registry (issue #47): a malformed entry is skipped and every
reader goes on with the rest; entries are authenticated with the deployment's
registry secret, a published spec never overrides a built-in, and only the
process that published an entry can withdraw or replace it; the registry's
total bytes are bounded; what the CLI prints of an entry cannot drive the
terminal. Against the session's dev server, each test on its own queue family
(its own registry workflow), the CLI as a real subprocess."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from module_workers import SPEC as WORD_COUNT
from pydantic import SecretStr
from support.pipelines import one_step_pipeline, refused
from support.procs import worker_env
from support.registry import entry, publish_raw
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError

from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.live_registry import (
    MAX_ENTRY_BYTES,
    MAX_REGISTRY_BYTES,
    WithdrawRequest,
    owner_of,
    sign_entry,
)
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.workers.process.live_registry import (
    NO_SECRET_REASON,
    live_specs,
    publishing,
    read_registry,
    resolve_view,
    secret_bytes,
)
from aiworker.workflows.worker_registry import WorkerRegistryWorkflow

AIWORKER = str(Path(sys.executable).parent / "aiworker")

VALIDATOR_PIPELINE = one_step_pipeline("trusted")


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AIWORKER, *args], env=env, capture_output=True, text=True, timeout=90)


async def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, off the event loop: the registry's worker runs on it."""
    return await asyncio.to_thread(_run, args, env)


def with_spec(raw_entry: dict[str, Any], worker_id: str, **changes: Any) -> dict[str, Any]:
    """``raw_entry`` whose worker ``worker_id`` has ``changes`` in its spec and listing,
    its spec hash recomputed as a publisher would (sha256 of the canonical spec)."""
    workers = []
    for w in raw_entry["workers"]:
        if w["worker_id"] == worker_id:
            spec = {**w["spec"], **changes}
            text = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            listing = {k: v for k, v in changes.items() if k in ("version", "task_queue")}
            w = {
                **w,
                **listing,
                "spec": spec,
                "spec_hash": hashlib.sha256(text.encode()).hexdigest(),
            }
        workers.append(w)
    return {**raw_entry, "workers": workers}


def word_count_entry(identity: str, **changes: Any) -> dict[str, Any]:
    raw = entry(identity, specs={"word-count": WORD_COUNT}).model_dump(mode="json")
    return with_spec(raw, "word-count", **changes) if changes else raw


async def registry_of(client: Client, settings: Settings) -> Any:
    reg = await read_registry(client, settings.task_queue_suffix, secret=settings.registry_secret)
    assert reg is not None
    return reg


async def test_an_entry_with_a_version_int_refuses_is_skipped_and_every_reader_goes_on(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    # "²".isdigit() is true and int("²") raises: once, this made every reader fail
    scrape = load_specs()[names.WEB_SCRAPE]
    bad = entry("bad@host").model_dump(mode="json")
    bad["workers"].append(
        {
            "worker_id": names.WEB_SCRAPE,
            "version": scrape.version,
            "spec_hash": "",
            "task_queue": scrape.task_queue,
            "kind": scrape.kind,
            "execution": scrape.execution,
            "served": True,
            "spec": scrape.model_dump(mode="json"),
        }
    )
    bad = with_spec(bad, names.WEB_SCRAPE, version="1.²")
    bad_plugin = word_count_entry("bad-plugin@host", version="1.²")
    env = worker_env(client, settings, tmp_path / "data")
    pipeline = tmp_path / "p.json"
    pipeline.write_text(json.dumps(VALIDATOR_PIPELINE))
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]) as stack:
        await publish_raw(client, settings, "bad@host", bad)
        await publish_raw(client, settings, "bad-plugin@host", bad_plugin)
        await publish_raw(client, settings, "good@host", word_count_entry("good@host"))

        reg = await registry_of(client, settings)
        assert [p.identity for p in reg.processes] == ["good@host"]
        assert len(reg.warnings) == 2, reg.warnings
        assert all("ignoring the malformed registry entry of process" in w for w in reg.warnings)
        assert (
            "'bad@host': worker 'web-scrape': $.version: Value error, a contract version is "
            "1 to 64 printable ASCII characters"
        ) in "\n".join(reg.warnings)
        # what a run's run config records: the good entry's spec, no failure
        specs = await live_specs(
            client, settings.task_queue_suffix, secret=settings.registry_secret
        )
        assert specs["word-count"].version == "1.0.0"

        workers = await cli(["workers"], env)
        assert workers.returncode == 0, workers.stdout + workers.stderr
        assert "word-count" in workers.stdout
        assert "warning: ignoring the malformed registry entry of process 'bad@host'" in (
            workers.stderr
        )
        checked = await cli(["check", str(pipeline)], env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "checked against the live registry (1 process)" in checked.stderr
        ran = await cli(["run", str(pipeline), "--json"], env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert json.loads(ran.stdout)["status"] == "succeeded"
        # a run whose run config reads the registry (it names a worker the
        # pipelines worker lacks): refused for that worker, not failed on the entry
        cause, _ = await refused(
            stack, {"name": "wc", "steps": [{"id": "c", "worker": "nobody", "input": {}}]}
        )
        assert cause.type == "invalid_input", cause
        assert "unknown worker 'nobody'" in str(cause)


async def test_entries_not_signed_with_the_secret_are_skipped_and_cannot_redirect_a_run(
    client: Client, settings: Settings
) -> None:
    evil = word_count_entry("evil@host", version="999", task_queue="evil-queue")
    other = Settings(
        task_queue_suffix=settings.task_queue_suffix,
        registry_secret=SecretStr("another deployment's secret"),
    )
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]) as stack:
        await publish_raw(client, settings, "evil@host", evil, sign=False)
        await publish_raw(client, other, "other@host", word_count_entry("other@host"))
        forged = sign_entry(word_count_entry("forged@host"), secret_bytes(settings.registry_secret))
        forged["task_queues"] = ["evil-queue"]  # changed after signing
        await publish_raw(client, settings, "forged@host", forged, sign=False)

        reg = await registry_of(client, settings)
        assert reg.processes == ()
        text = "\n".join(reg.warnings)
        assert "'evil@host': unsigned" in text
        assert "'other@host': its signature does not match" in text
        assert "'forged@host': its signature does not match" in text
        assert (
            await live_specs(client, settings.task_queue_suffix, secret=settings.registry_secret)
            == {}
        )
        view = await resolve_view(client, settings, lambda: load_specs())
        assert view.source == "local"
        with pytest.raises(PipelineSpecError, match="unknown worker 'word-count'"):
            view.check(
                {"name": "wc", "steps": [{"id": "c", "worker": "word-count", "input": {}}]},
                settings,
            )
        # the run's own record (run config): word-count is unknown, nothing goes to
        # evil-queue
        cause, handle = await refused(
            stack, {"name": "wc", "steps": [{"id": "c", "worker": "word-count", "input": {}}]}
        )
        assert cause.type == "invalid_input", cause
        assert "unknown worker 'word-count'" in str(cause)
        history = await handle.fetch_history()
        assert "evil-queue" not in history.to_json()

        # a reader without a secret reads nothing published, and says why
        unkeyed = settings.model_copy(update={"registry_secret": None})
        view = await resolve_view(client, unkeyed, lambda: load_specs())
        assert (view.source, view.reason) == ("local", NO_SECRET_REASON)


async def test_a_published_spec_never_overrides_a_built_in(
    client: Client, settings: Settings
) -> None:
    validator = load_specs()[names.VALIDATOR]
    shadow = with_spec(
        entry("shadow@host").model_dump(mode="json"),
        names.VALIDATOR,
        version="999",
        input_schema={"not": {}},
        examples=[],
    )
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        # signed with the deployment's own secret: authentic, and still not used
        await publish_raw(client, settings, "shadow@host", shadow)
        reg = await registry_of(client, settings)
        assert [p.identity for p in reg.processes] == ["shadow@host"]
        view = await resolve_view(client, settings, dict)
    assert view.source == "live"
    assert view.specs[names.VALIDATOR] == validator
    assert view.check(VALIDATOR_PIPELINE, settings).steps[0].worker == names.VALIDATOR


async def test_only_the_publishing_process_withdraws_or_replaces_its_entry(
    client: Client, settings: Settings
) -> None:
    handle = client.get_workflow_handle(
        names.worker_registry_workflow_id(settings.task_queue_suffix)
    )

    async def listed() -> set[str]:
        return {p.identity for p in (await registry_of(client, settings)).processes}

    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        own = entry("own@host")
        async with publishing(client, settings, own) as pub:
            await wait_until(pub.published.is_set, "the first publish")
            # a withdraw by identity alone, and one with a wrong key
            await handle.signal(WorkerRegistryWorkflow.withdraw, "own@host")
            await handle.signal(
                WorkerRegistryWorkflow.withdraw, WithdrawRequest(identity="own@host", key="guess")
            )
            # a publish under its identity by anyone else: refused, nothing written
            with pytest.raises(WorkflowUpdateFailedError) as taken:
                await publish_raw(
                    client,
                    settings,
                    "own@host",
                    entry("own@host").model_dump(mode="json"),
                    owner=owner_of("another key"),
                )
            assert "held by another publisher" in str(taken.value.cause)
            with pytest.raises(WorkflowUpdateFailedError):
                await publish_raw(
                    client, settings, "own@host", entry("own@host").model_dump(mode="json")
                )
            # an update after the signals: the workflow has handled them by its answer
            await publish_raw(
                client, settings, "later@host", entry("later@host").model_dump(mode="json")
            )
            assert await listed() == {"own@host", "later@host"}
        # its own withdraw, on the way out: gone at once
        assert await listed() == {"later@host"}
        history = await handle.fetch_history()
    # the owners' decisions (behind their patch) replay as they ran
    from temporalio.worker import Replayer

    from aiworker.workers.client.temporal_client import data_converter

    result = await Replayer(
        workflows=[WorkerRegistryWorkflow], data_converter=data_converter(None)
    ).replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    markers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert markers, "the patch registry-owners was not recorded"


async def test_the_registry_refuses_an_entry_past_its_total_bytes(
    client: Client, settings: Settings
) -> None:
    per_entry = MAX_ENTRY_BYTES - 50_000
    fits = MAX_REGISTRY_BYTES // per_entry
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        for i in range(fits):
            raw = entry(f"big{i}@host").model_dump(mode="json")
            raw["padding"] = "x" * (per_entry - len(json.dumps(raw)))
            await publish_raw(client, settings, f"big{i}@host", raw)
        raw = entry("one-more@host").model_dump(mode="json")
        raw["padding"] = "x" * (per_entry - len(json.dumps(raw)))
        with pytest.raises(WorkflowUpdateFailedError) as refused_:
            await publish_raw(client, settings, "one-more@host", raw)
        assert f"over its cap of {MAX_REGISTRY_BYTES}" in str(refused_.value.cause)
        # a listed process may still refresh its entry (it replaces its own bytes)
        raw = entry("big0@host").model_dump(mode="json")
        raw["padding"] = "x" * (per_entry - len(json.dumps(raw)))
        await publish_raw(client, settings, "big0@host", raw)
        # and a small entry still fits beside them
        await publish_raw(
            client, settings, "small@host", entry("small@host").model_dump(mode="json")
        )
        reg = await registry_of(client, settings)
    assert len(reg.processes) == fits + 1


ESCAPES = ["\x1b[2J", "\x1b]52;c;aGVsbG8=\x07", "\x9b31m", "\u202e"]


async def test_what_the_cli_prints_of_an_entry_cannot_drive_the_terminal(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    identity = f"{ESCAPES[0]}{ESCAPES[1]}7@pod"
    hostile = entry(identity, build_id=f"b{ESCAPES[2]}{ESCAPES[3]}\nforged row").model_dump(
        mode="json"
    )
    env = worker_env(client, settings, tmp_path / "data")
    name = f"esc{settings.task_queue_suffix}"
    wid = f"run{ESCAPES[0]}{settings.task_queue_suffix}"
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]) as stack:
        await publish_raw(client, settings, identity, hostile)
        workers = await cli(["workers"], env)
        # a run whose workflow id holds the same sequences, listed by `aiworker list`
        handle = await stack.start({**VALIDATOR_PIPELINE, "name": name}, id=wid)
        await handle.result()
        seen: list[subprocess.CompletedProcess[str]] = []

        async def listed() -> bool:
            seen.append(await cli(["list", "--pipeline", name], env))
            return "\\x1b[2J" in seen[-1].stdout

        # visibility catches up with the run's search attributes in its own time
        await wait_until(listed, lambda: f"the run in `aiworker list`: {seen[-1].stdout!r}")
        listing = seen[-1]
    assert workers.returncode == 0, workers.stdout + workers.stderr
    assert listing.returncode == 0, listing.stdout + listing.stderr
    for out in (workers.stdout, workers.stderr, listing.stdout, listing.stderr):
        for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert raw not in out, repr(out)
    assert "\\x1b[2J\\x1b]52;c;aGVsbG8=\\x077@pod" in workers.stdout
    assert "b\\u009b31m\\u202e\\x0aforged row" in workers.stdout
    assert not any(line.startswith("forged row") for line in workers.stdout.splitlines())
    assert f"run\\x1b[2J{settings.task_queue_suffix}" in listing.stdout


def test_the_registry_secret_setting_is_long_secret_and_read_beside_a_dev_stack(
    tmp_path: Path,
) -> None:
    from aiworker.config.settings import SettingsError
    from aiworker.workers.devstack.state import ensure_registry_secret

    with pytest.raises(SettingsError, match=r"AIWORKER_REGISTRY_SECRET: .*at least 16"):
        Settings.from_env({"AIWORKER_REGISTRY_SECRET": "short"})
    given = Settings.from_env({"AIWORKER_REGISTRY_SECRET": "s" * 16})
    assert "s" * 16 not in repr(given)
    assert "s" * 16 in given.secret_values()  # redacted from every log line
    # none set: a dev stack's data dir holds one, which wins only when unset
    data = tmp_path / "data"
    unset = Settings.from_env({"AIWORKER_DATA_DIR": str(data)})
    assert unset.registry_secret is None
    ensure_registry_secret(data)
    written = (data / "registry.secret").read_text().strip()
    ensure_registry_secret(data)  # kept, not replaced
    assert (data / "registry.secret").read_text().strip() == written
    found = Settings.from_env({"AIWORKER_DATA_DIR": str(data)})
    assert found.registry_secret is not None
    assert found.registry_secret.get_secret_value() == written
    own = Settings.from_env({"AIWORKER_DATA_DIR": str(data), "AIWORKER_REGISTRY_SECRET": "o" * 20})
    assert own.registry_secret is not None
    assert own.registry_secret.get_secret_value() == "o" * 20


def test_the_cli_streams_escape_controls_and_keep_json_json() -> None:
    import io

    from aiworker.workers.client.terminal import SafeStream

    hostile = {"id": "run\x1b[2J", "build": "b\x7f\x9b31m\u202e\u2028", "text": "a\tb"}
    out = io.StringIO()
    stream = SafeStream(out)
    # a printer that forgot to escape: JSON (ensure_ascii=False leaves C1 raw) and text
    stream.write(json.dumps(hostile, ensure_ascii=False) + "\n")
    stream.write(f"{hostile['build']} done\n")
    printed = out.getvalue()
    for raw in ("\x1b", "\x7f", "\x9b", "\u202e", "\u2028"):
        assert raw not in printed, repr(printed)
    first, second, _ = printed.split("\n")
    assert json.loads(first) == hostile  # the same value, escaped
    assert second == "b\\u007f\\u009b31m\\u202e\\u2028 done"
