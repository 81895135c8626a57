"""The tenant registry in the worker runtime: calls that do not come from a
pipeline are held to it too (unknown tenant, workers, egress allow-list)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.loopback import HTML, Exchange, Loopback, serve
from support.payloads import stack_settings
from temporalio.exceptions import ApplicationError

from aiworker.activities.aggregator import Aggregator
from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.limits import rate_limit_for
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.tools import EgressPolicy, scrape_tools
from aiworker.activities.validator import Validator
from aiworker.activities.web_scrape import WebScrape
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings, parse_rate_limits
from aiworker.schemas.protocol import WorkerResponse
from aiworker.schemas.tenants import TenantRegistry

REGISTRY = TenantRegistry.model_validate(
    {
        "tenants": {
            "acme": {"workers": ["validator", "web-scrape"], "egress_allow": ["allowed.test"]},
            "globex": {"rate_limits": {"web-scrape": "100/min", "llm-call": "2/min"}},
        }
    }
)


def _request(worker_id: str, tenant: str, worker_input: dict[str, Any]) -> dict[str, Any]:
    return {
        "worker_id": worker_id,
        "idempotency_key": "k/1",
        "tenant": tenant,
        "input": worker_input,
    }


VALIDATE = {"data": {"a": 1}, "schema": {"type": "object"}}


async def _fails(runtime: WorkerRuntime, worker: Any, request: dict[str, Any]) -> ApplicationError:
    with pytest.raises(ApplicationError) as e:
        await runtime.run(worker, request)
    return e.value


async def test_a_request_for_an_unknown_tenant_is_invalid_input(tmp_path: Path) -> None:
    runtime = WorkerRuntime(stack_settings(tmp_path, tenants=REGISTRY), load_specs())
    err = await _fails(runtime, Validator(), _request("validator", "initech", VALIDATE))
    assert (err.type, err.non_retryable) == ("invalid_input", True)
    assert err.details[0]["field"] == "tenant"
    ok = await runtime.run(Validator(), _request("validator", "globex", VALIDATE))
    assert ok.outputs["valid"] is True
    # without a registry, any well-formed name is taken as given
    free = WorkerRuntime(stack_settings(tmp_path), load_specs())
    assert (await free.run(Validator(), _request("validator", "initech", VALIDATE))).outputs


async def test_a_worker_the_tenant_may_not_call_is_invalid_input(tmp_path: Path) -> None:
    runtime = WorkerRuntime(stack_settings(tmp_path, tenants=REGISTRY), load_specs())
    request = _request("aggregator", "acme", {"policy": "all", "branches": {}})
    err = await _fails(runtime, Aggregator(), request)
    assert (err.type, err.details[0]["field"]) == ("invalid_input", "worker_id")
    assert "may not call worker 'aggregator'" in str(err)


@pytest.mark.parametrize("tenant", ["Acme", "../acme", "a" * 64, "acme\n"])
async def test_a_request_with_a_bad_tenant_name_is_invalid_input(
    tmp_path: Path, tenant: str
) -> None:
    runtime = WorkerRuntime(stack_settings(tmp_path), load_specs())
    err = await _fails(runtime, Validator(), _request("validator", tenant, VALIDATE))
    assert (err.type, err.details[0]["field"]) == ("invalid_input", "tenant")


@pytest.fixture
def site() -> Iterator[Loopback]:
    def handle(ex: Exchange) -> None:
        if ex.path == "/robots.txt":
            ex.send(404, b"", "text/plain")
        else:
            ex.send(200, b"<html><h1>Hello</h1></html>", HTML)

    with serve(handle) as server:
        yield server


def _scraper(settings: Settings, site: Loopback) -> WorkerRuntime:
    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]  # every *.test name is the loopback site

    egress = EgressPolicy.from_settings(
        settings, trusted_endpoints=[("127.0.0.1", site.port)], resolver=resolver
    )
    breakers = BreakerRegistry("host", failure_threshold=10_000)
    tools = scrape_tools(settings, egress=egress, breakers=breakers)
    return WorkerRuntime(settings, load_specs(), tools=tools)


async def _scrape(runtime: WorkerRuntime, tenant: str, host: str, port: int) -> WorkerResponse:
    url = f"http://{host}:{port}/page"
    spec = {"fields": {"h1": {"selector": "h1"}}}
    return await runtime.run(
        WebScrape(), _request("web-scrape", tenant, {"url": url, "extraction_spec": spec})
    )


async def test_the_tenant_egress_allow_list_holds_with_the_settings_one(
    tmp_path: Path, site: Loopback
) -> None:
    settings = stack_settings(tmp_path, tenants=REGISTRY, allow_private_networks=False)
    runtime = _scraper(settings, site)
    try:
        ok = await _scrape(runtime, "acme", "allowed.test", site.port)
        with pytest.raises(ApplicationError) as denied:
            await _scrape(runtime, "acme", "other.test", site.port)
        # another tenant, without a list, reaches the same host
        other = await _scrape(runtime, "globex", "other.test", site.port)
    finally:
        await runtime.tools["fetch_url"].aclose()
    assert ok.outputs["data"]["h1"] == "Hello"
    assert (denied.value.type, denied.value.non_retryable) == ("egress_denied", True)
    assert "tenant egress allow-list" in str(denied.value)
    assert other.outputs["data"]["h1"] == "Hello"
    # the operator's list and the tenant's both hold: the tighter wins
    narrow = stack_settings(
        tmp_path, tenants=REGISTRY, allow_private_networks=False, egress_allow=("other.test",)
    )
    runtime = _scraper(narrow, site)
    try:
        with pytest.raises(ApplicationError) as by_settings:
            await _scrape(runtime, "acme", "allowed.test", site.port)
    finally:
        await runtime.tools["fetch_url"].aclose()
    assert "settings egress allow-list" in str(by_settings.value)


def test_a_registry_rate_ceiling_and_the_rate_rules_the_tighter_wins(tmp_path: Path) -> None:
    specs = load_specs()
    rules = tuple(parse_rate_limits("web-scrape:globex=3/min,llm-call:*=600/min"))
    settings = stack_settings(tmp_path, tenants=REGISTRY, rate_limits=rules)
    # the rule (3/min) is tighter than the registry (100/min)
    assert rate_limit_for(settings, specs, "web-scrape", "globex") == (3, 60.0)
    # the registry (2/min) is tighter than the rule (600/min)
    assert rate_limit_for(settings, specs, "llm-call", "globex") == (2, 60.0)
    # the registry alone limits a worker that nothing else does
    loose = stack_settings(tmp_path, tenants=REGISTRY)
    assert rate_limit_for(loose, specs, "llm-call", "globex") == (2, 60.0)
    # the spec's own 10/min beats the registry's 100/min
    assert rate_limit_for(loose, specs, "web-scrape", "globex") == (10, 60.0)
    assert rate_limit_for(loose, specs, "validator", "acme") is None
