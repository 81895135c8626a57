"""The conformance kit (``aiworker conformance``) against live workers on the
session's Temporal dev server.

It passes on every built-in (web-scrape against a loopback site, llm-call and
the prompt worker ``classify-ticket`` against a loopback model, publish into a
file sink under the test's data directory), on a plugin module's worker, and
fails with the reason on deliberately broken workers: one whose output breaks
its schema, one that crashes (``internal``, retried) on bad input, and a
stand-in that ignores the tightened timeout. The command itself runs as a
subprocess, as a plugin's CI would run it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from conformance_workers import LaxInput, TextLength, WrongOutput, spec
from conftest import installed_workers, running_stack

# The loopback model provider lives beside the llm-call tests.
from fixtures.llm_fakes import FakeProvider, fake  # noqa: F401  (module fixture)
from fixtures.scrape_site import FixtureSite, site  # noqa: F401  (module fixture)
from jsonschema import Draft202012Validator
from prometheus_client import CollectorRegistry
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from aiworker.activities.llm import LlmMetrics
from aiworker.config.catalog import Catalog, CatalogEntry, builtin_spec
from aiworker.config.settings import Settings
from aiworker.schemas.spec import WorkerSpec
from aiworker.workers.conformance.run import (
    ConformanceReport,
    check_worker,
    examples_for,
    invalid_inputs,
    other_major,
)
from aiworker.workers.devstack.devserver import free_port
from aiworker.workers.process.resources import build_language_model, build_tools
from aiworker.workers.process.worker_set import WorkerSet

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
AIWORKER = str(Path(sys.executable).parent / "aiworker")
BUILTINS = ("validator", "aggregator", "web-scrape", "llm-call", "publish")
ALL_CHECKS_PASS = ("tightened timeout", "invalid input", "wrong version", "error info")
TICKET_REPLY = {"category": "bug", "priority": "urgent", "summary": "Checkout fails with 500."}


def statuses(report: ConformanceReport) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def served(*workers: Any, catalog_specs: list[WorkerSpec] | None = None) -> WorkerSet:
    """A worker set that serves ``workers`` (its catalog: their specs, or ``catalog_specs``)."""
    specs = catalog_specs or [w.spec for w in workers]
    return WorkerSet(
        Catalog(CatalogEntry(s, "test") for s in specs), {w.worker_id: w for w in workers}
    )


def cli_env(client: Client, settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = client.service_client.config.target_host
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = settings.task_queue_suffix
    return env | extra


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AIWORKER, "conformance", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


# --- the built-ins ---------------------------------------------------------------------


async def test_every_builtin_passes_and_skips_what_needs_the_network_or_changes_the_world(
    client: Client, settings: Settings
) -> None:
    async with running_stack(client, settings):
        reports = {
            wid: await check_worker(client, wid, queue_suffix=settings.task_queue_suffix)
            for wid in BUILTINS
        }
    for wid, report in reports.items():
        assert report.passed, report.render()
        assert report.task_queue == builtin_spec(wid).task_queue + settings.task_queue_suffix
        for name in ("invalid input", "wrong version", "error info"):
            assert statuses(report)[name] == "pass", report.render()
    for wid in ("validator", "aggregator"):
        assert set(statuses(reports[wid]).values()) == {"pass"}, reports[wid].render()
        assert len(reports[wid].checks) == len(builtin_spec(wid).examples) + 4
    for wid in ("web-scrape", "llm-call"):
        first = reports[wid].checks[0]
        assert first.status == "skip" and "--network" in first.reason
        assert reports[wid].check("tightened timeout").status == "skip"
    first = reports["publish"].checks[0]
    assert first.status == "skip" and "--side-effects" in first.reason
    # the skipped example never reached the sink
    assert not (settings.data_dir / "sinks").exists()
    assert "error info: 2 failure(s)" in reports["validator"].render()
    assert reports["validator"].render().endswith("PASSED: 6 passed, 0 failed, 0 skipped")


async def test_network_and_side_effect_builtins_pass_against_loopback_servers(
    client: Client, settings: Settings, site: FixtureSite, fake: FakeProvider
) -> None:
    model = f"scripted@{uuid.uuid4().hex[:10]}"
    fake.script(model, "ready")
    s = settings.model_copy(update={"llm_base_url": fake.root + "/v1", "llm_model": model})
    tools = build_tools(s)
    scrape = builtin_spec("web-scrape")
    # the spec's example names a public site; this one names the loopback listing
    loopback = examples_for(
        scrape,
        [
            {
                "description": "the loopback listing",
                "network": True,
                "input": {
                    "url": site.url("/list"),
                    "extraction_spec": {"fields": {"title": {"selector": "h1", "required": True}}},
                },
            }
        ],
        "test",
    )
    suffix = s.task_queue_suffix
    try:
        async with running_stack(client, s, tools=tools):
            web = await check_worker(
                client, scrape, queue_suffix=suffix, network=True, examples=loopback
            )
            llm = await check_worker(client, "llm-call", queue_suffix=suffix, network=True)
            publish = await check_worker(client, "publish", queue_suffix=suffix, side_effects=True)
    finally:
        await tools["fetch_url"].aclose()
        await tools["language_model"].aclose()
    for report in (web, llm, publish):
        assert report.passed, report.render()
        assert set(statuses(report).values()) == {"pass"}, report.render()
    assert web.checks[0].name == "example[0] (the loopback listing)"
    # the example and the tightened-timeout call reached the model; the refused ones did not
    assert len(fake.seen(model)) == 2
    sink = s.data_dir / "sinks" / "default" / "conformance" / "example.jsonl"
    lines = [json.loads(x) for x in sink.read_text("utf-8").splitlines()]
    record = builtin_spec("publish").examples[0].input["record"]
    # the tightened-timeout call reuses the example's idempotency key: published once
    assert len(lines) == 1 and lines[0]["record"] == record, lines


# --- a prompt worker and a plugin ------------------------------------------------------


async def test_the_prompt_worker_passes_against_a_loopback_model(
    client: Client, settings: Settings, tmp_path: Path, fake: FakeProvider
) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "examples" / "prompts" / "classify-ticket.json", specs)
    model = f"scripted@{uuid.uuid4().hex[:10]}"
    fake.script(model, json.dumps(TICKET_REPLY))
    s = Settings.model_validate(
        settings.model_dump()
        | {"worker_specs": (specs,), "llm_base_url": fake.root + "/v1", "llm_model": model}
    )
    lm = build_language_model(s, {}, llm_metrics=LlmMetrics(CollectorRegistry()))
    try:
        with installed_workers(s, entry_points=()) as ws:
            async with running_stack(client, s, workers=ws, tools={"language_model": lm}):
                offline = await check_worker(
                    client, "classify-ticket", queue_suffix=s.task_queue_suffix
                )
                online = await check_worker(
                    client, "classify-ticket", queue_suffix=s.task_queue_suffix, network=True
                )
    finally:
        await lm.aclose()
    assert offline.passed and statuses(offline)["tightened timeout"] == "skip"
    assert online.passed, online.render()
    assert set(statuses(online).values()) == {"pass"}, online.render()
    assert [c.name for c in online.checks[:2]] == [
        "example[0] (an outage report: a bug, urgent)",
        "example[1] (a login problem without a plan)",
    ]
    assert len(fake.seen(model)) == 3  # two examples and the tightened-timeout call


async def test_the_cli_checks_a_plugin_module_worker_and_prints_json(
    client: Client, settings: Settings
) -> None:
    plugin = settings.model_copy(update={"worker_modules": ("module_workers",)})
    env = cli_env(
        client,
        settings,
        AIWORKER_WORKER_MODULES="module_workers",
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    with installed_workers(plugin, entry_points=()) as ws:
        async with running_stack(client, plugin, workers=ws):
            text = await _to_thread(run_cli, ["word-count"], env)
            as_json = await _to_thread(run_cli, ["validator", "--json"], env)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "PASS  example[0]" in text.stdout
    assert "PASS  invalid input: an input without its required property 'text'" in text.stdout
    assert text.stdout.rstrip().endswith("PASSED: 5 passed, 0 failed, 0 skipped"), text.stdout
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["worker_id"] == "validator" and doc["passed"] is True
    assert [c["name"] for c in doc["checks"]][2:] == [
        "tightened timeout",
        "invalid input",
        "wrong version",
        "error info",
    ]
    assert {c["status"] for c in doc["checks"]} == {"pass"}


# --- broken workers --------------------------------------------------------------------


async def test_a_worker_whose_output_breaks_its_schema_fails_the_examples(
    client: Client, settings: Settings
) -> None:
    async with running_stack(client, settings, workers=served(WrongOutput())):
        report = await check_worker(
            client, WrongOutput.spec, queue_suffix=settings.task_queue_suffix
        )
    assert not report.passed
    example = report.check("example[0] (three letters)")
    assert example.status == "fail"
    assert "failed with invalid_output after 1 attempt(s): output $.length" in example.reason
    assert statuses(report)["tightened timeout"] == "fail"
    # what it refuses, it refuses correctly
    assert statuses(report)["invalid input"] == "pass"
    assert statuses(report)["wrong version"] == "pass"
    assert statuses(report)["error info"] == "pass"
    assert report.render().endswith("FAILED: 3 passed, 2 failed, 0 skipped")


async def test_a_worker_that_crashes_on_bad_input_fails_as_internal_and_retried(
    client: Client, settings: Settings
) -> None:
    published = WorkerSpec.model_validate(spec("lax-input"))
    async with running_stack(client, settings, workers=served(LaxInput())):
        report = await check_worker(
            client, published, queue_suffix=settings.task_queue_suffix, call_timeout=30
        )
    assert not report.passed
    bad = report.check("invalid input")
    assert bad.status == "fail"
    assert "failed as 'internal', not 'invalid_input'" in bad.reason
    assert "not marked non_retryable" in bad.reason
    assert "took 3 attempts, not 1" in bad.reason
    assert "KeyError" in bad.reason
    assert [c.name for c in report.failed()] == ["invalid input"]


def _ignores_the_tightened_timeout() -> Any:
    """A stand-in for ``text-length`` that keeps every rule but one: it reports
    (and so would run under) the spec's timeout whatever the request says."""
    contract = WorkerSpec.model_validate(spec("text-length"))
    inputs = Draft202012Validator(contract.input_schema)

    def refuse(message: str) -> ApplicationError:
        info = {"code": "invalid_input", "message": message, "retryable": False}
        return ApplicationError(message, info, type="invalid_input", non_retryable=True)

    @activity.defn(name="text-length")
    async def stand_in(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("version", "").split(".")[0] != "1":
            raise refuse(f"version {request.get('version')!r} is not 1")
        if not inputs.is_valid(request.get("input")):
            raise refuse("input breaks input_schema")
        return {
            "worker_id": "text-length",
            "version": contract.version,
            "status": "succeeded",
            "outputs": {"length": len(request["input"]["text"])},
            "observability": {
                "worker_id": "text-length",
                "attempt": activity.info().attempt,
                "timeout_seconds": contract.constraints.timeout_seconds,
            },
        }

    return stand_in


async def test_a_worker_that_ignores_the_tightened_timeout_fails_in_the_cli_with_exit_1(
    client: Client, settings: Settings
) -> None:
    module = settings.model_copy(update={"worker_modules": ("conformance_workers",)})
    env = cli_env(
        client,
        settings,
        AIWORKER_WORKER_MODULES="conformance_workers",
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    with installed_workers(module, entry_points=()) as ws:
        async with running_stack(client, module, workers=ws):
            good = await _to_thread(run_cli, ["text-length"], env)
        async with running_stack(
            client,
            module,
            workers=ws,
            replace_activities={"text-length": _ignores_the_tightened_timeout()},
        ):
            bad = await _to_thread(run_cli, ["text-length"], env)
    assert good.returncode == 0, good.stdout + good.stderr
    assert bad.returncode == 1, bad.stdout + bad.stderr
    (failed,) = [line for line in bad.stdout.splitlines() if line.startswith("  FAIL")]
    assert failed == (
        "  FAIL  tightened timeout: sent constraints.timeout_seconds=6 (spec 8), but the worker "
        "ran under observability.timeout_seconds=8"
    )
    assert "PASS  example[0] (three letters)" in bad.stdout
    assert "PASS  error info: 2 failure(s)" in bad.stdout


# --- bad usage -------------------------------------------------------------------------


async def test_bad_usage_exits_2_with_one_line(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    env = cli_env(client, settings)
    unknown = await _to_thread(run_cli, ["no-such-worker"], env)
    unreachable = await _to_thread(
        run_cli, ["validator", "--address", f"127.0.0.1:{free_port()}"], env
    )
    examples = tmp_path / "examples.json"
    examples.write_text(json.dumps([{"input": {"data": 1}}]))
    bad_examples = await _to_thread(run_cli, ["validator", "--examples", str(examples)], env)
    agent = await _to_thread(run_cli, ["llm-agent"], env)
    for proc in (unknown, unreachable, bad_examples, agent):
        # Temporal unreachable fails (1) as for every command; the rest is bad usage
        assert proc.returncode == (1 if proc is unreachable else 2), proc.stdout + proc.stderr
        assert proc.stdout == "" and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert unknown.stderr.startswith("aiworker: unknown worker 'no-such-worker'; known: ")
    assert "validator" in unknown.stderr and "web-scrape" in unknown.stderr
    assert unreachable.stderr.startswith("aiworker: cannot reach Temporal: ")
    assert bad_examples.stderr.startswith(f"aiworker: --examples {examples}: examples[0].input")
    assert "'schema' is a required property" in bad_examples.stderr
    assert agent.stderr.startswith("aiworker: 'llm-agent' runs as a child workflow")
    assert "checks activity workers" in agent.stderr


async def test_a_worker_nobody_serves_fails_every_call_with_the_queue_named(
    client: Client, settings: Settings
) -> None:
    # no worker process: each call is bounded by call_timeout, then reported
    report = await check_worker(
        client, TextLength.spec, queue_suffix=settings.task_queue_suffix, call_timeout=2
    )
    assert not report.passed
    queue = f"aiworker-pipelines{settings.task_queue_suffix}"
    for name in ("example[0] (three letters)", "tightened timeout", "invalid input"):
        check = report.check(name)
        assert check.status == "fail"
        assert check.reason.startswith(
            f"no answer within 2s: is a worker process polling task queue {queue}?"
        ), check.reason
    # a Temporal timeout is no worker failure: nothing to look for an ErrorInfo in
    assert report.check("error info").status == "skip"


async def test_a_broken_plugin_is_reported_even_when_temporal_is_unreachable(
    client: Client, settings: Settings
) -> None:
    env = cli_env(client, settings, AIWORKER_WORKER_MODULES="no_such_plugin_module")
    env["TEMPORAL_ADDRESS"] = f"127.0.0.1:{free_port()}"
    env["AIWORKER_METRICS_PORT"] = "0"
    proc = await _to_thread(
        lambda: subprocess.run(
            [AIWORKER, "worker"], env=env, capture_output=True, text=True, timeout=90, cwd=ROOT
        )
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("aiworker: module no_such_plugin_module (AIWORKER_WORKER_MODULES)")
    assert "ModuleNotFoundError" in line


# --- the derivations -------------------------------------------------------------------


def test_invalid_inputs_are_derived_only_where_the_schema_refuses_them() -> None:
    strict = WorkerSpec.model_validate(spec("x"))
    derived = invalid_inputs(strict)
    assert [why for _, why in derived] == [
        "without its required property 'text'",
        "with property 'text' of the wrong type (12345)",
        "with the undeclared property 'conformance_undeclared_property'",
    ]
    assert derived[0][0] == {}
    # an input schema that accepts any object leaves nothing to derive: the check is skipped
    assert invalid_inputs(WorkerSpec.model_validate(spec("y", input_schema={}))) == []
    assert other_major("1.2.0") == "2.2.0" and other_major("7") == "8"
    assert other_major("v1") == "v1x"


async def _to_thread(fn: Any, *args: Any) -> Any:
    import asyncio

    return await asyncio.to_thread(fn, *args)


# --- a reply that cannot be decoded ----------------------------------------------------


def _undecodable_reply() -> Any:
    """A stand-in for ``text-length`` whose reply is a JSON list, not an envelope
    (an external worker in another language that answers with the wrong shape)."""

    @activity.defn(name="text-length")
    async def stand_in(request: dict[str, Any]) -> list[Any]:
        return ["not", "an", "envelope"]

    return stand_in


async def test_a_worker_whose_reply_cannot_be_decoded_fails_with_the_reason(
    client: Client, settings: Settings
) -> None:
    # Before: the workflow failed decoding the reply and the command crashed with
    # "unexpected error (WorkflowFailureError)" instead of a report.
    acts = {"text-length": _undecodable_reply()}
    async with running_stack(
        client, settings, workers=served(TextLength()), replace_activities=acts
    ):
        report = await check_worker(
            client, TextLength.spec, queue_suffix=settings.task_queue_suffix
        )
    assert not report.passed
    example = report.check("example[0] (three letters)")
    assert example.status == "fail"
    assert "reply could not be decoded" in example.reason, example.reason
    assert "it is JSON, but not an object" in example.reason
    assert report.render().splitlines()[-1].startswith("FAILED:"), report.render()
