"""The contracts' validator: jsonschema alone, jsonschema-rs in front of it (shipped),
and jsonschema-rs alone, on the step path and per runtime call.

aiworker applies every JSON Schema with jsonschema behind
:mod:`aiworker.schemas.safe_schema`; a contract (:mod:`aiworker.activities.contracts`)
asks jsonschema-rs first whether a value is surely valid, where the schema means the
same to both, and jsonschema words the errors. This part times, in one run and
interleaved, the checks a step makes (the built-in specs' input and output schemas
on the values a step sends and returns): ``jsonschema`` (safe_schema alone),
``contract`` (the shipped contract) and ``jsonschema_rs`` (jsonschema-rs alone,
configured as the contract configures it: its linear-time ``regex`` engine, a
retriever that refuses every ``$ref`` retrieval, ``safe_schema.FORMATS``' Python
format checks). Then the runtime's own cost per call (``bench/overhead.py``'s
validator call) with jsonschema-only contracts and with the shipped ones, and
web-scrape's input through the contracts' memo of valid parts (``input_memo``).
Figures are medians in microseconds and ratios.

Why jsonschema-rs is not the validator on its own: the docstring of
:mod:`aiworker.schemas.safe_schema`.

``python -m bench.schemas`` (``--quick``) runs it alone.
"""

from __future__ import annotations

import importlib.metadata
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from aiworker.activities.call_telemetry import observe_call
from aiworker.activities.contracts import Contract, rs_validator
from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.runtime import WorkerContext, WorkerRuntime
from aiworker.activities.toolbox import Toolbox
from aiworker.activities.validator import Validator
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import safe_schema
from aiworker.schemas.protocol import WorkerRequest
from bench.overhead import REQUEST
from bench.scrape import ITEMS_PER_PAGE, SPEC

Check = Callable[[Any], list[Any]]


def _page() -> dict[str, Any]:
    """A web-scrape step's outputs for one page of bench/scrape.py's site."""
    items = [
        {"name": f"item {i}", "price": 3.5 + i, "link": f"http://127.0.0.1:8000/p/{i}"}
        for i in range(ITEMS_PER_PAGE)
    ]
    return {
        "data": {"title": "Products", "items": items},
        "source": {
            "url": "http://127.0.0.1:8000/p/1",
            "final_url": "http://127.0.0.1:8000/p/1",
            "status_code": 200,
            "fetched_at": "2026-12-07T02:50:00.123456+00:00",
            "content_type": "text/html",
            "encoding": "utf-8",
            "bytes": 5321,
            "sha256": "a" * 64,
            "elapsed_ms": 3.2,
        },
        "warnings": [],
    }


def _cases() -> dict[str, tuple[dict[str, Any], Any]]:
    specs = load_specs()
    scrape, validator = specs["web-scrape"], specs["validator"]
    return {
        "web-scrape input": (
            scrape.input_schema,
            {"url": "http://127.0.0.1:8000/p/1", "extraction_spec": SPEC},
        ),
        "web-scrape output": (scrape.output_schema, _page()),
        "validator input": (validator.input_schema, REQUEST["input"]),
        "validator output": (validator.output_schema, {"valid": True, "errors": []}),
    }


def _rs(schema: dict[str, Any]) -> Check:
    rs = rs_validator(schema, shared_only=False)
    return lambda v: [] if rs.is_valid(v) else list(rs.iter_errors(v))


def _arms(schema: dict[str, Any]) -> dict[str, Check]:
    js = safe_schema.cached_validator(schema)
    return {
        "jsonschema": lambda v: safe_schema.errors(js, v),
        "contract": Contract(schema, remember=False).errors,
        "jsonschema_rs": _rs(schema),
    }


def step_path(rounds: int, n: int) -> dict[str, Any]:
    """Per check, the median us of each validator over ``rounds`` interleaved rounds."""
    out: dict[str, Any] = {}
    for name, (schema, value) in _cases().items():
        arms = _arms(schema)
        for arm, check in arms.items():
            if check(value):  # all must find the value valid, or the race is unfair
                raise AssertionError(f"{name}: {arm} finds the bench value invalid")
        samples: dict[str, list[float]] = {arm: [] for arm in arms}
        for _ in range(rounds):
            for arm, check in arms.items():
                t0 = time.perf_counter_ns()
                for _ in range(n):
                    check(value)
                samples[arm].append((time.perf_counter_ns() - t0) / n / 1000)
        med = {arm: statistics.median(s) for arm, s in samples.items()}
        out[name] = {
            **{f"{arm}_us": round(us, 2) for arm, us in med.items()},
            "contract_vs_jsonschema": round(med["contract"] / med["jsonschema"], 4),
            "rs_vs_jsonschema": round(med["jsonschema_rs"] / med["jsonschema"], 4),
        }
    return out


def input_memo(rounds: int) -> dict[str, Any]:
    """web-scrape's input as a crawl sends it (one extraction spec, a new url each
    call): jsonschema in full, through the contract's memo of valid parts
    (:mod:`aiworker.activities.contracts`), and jsonschema-rs; median us per call."""
    schema, value = _cases()["web-scrape input"]
    full, memo = _JsonschemaContract(schema, remember=False), Contract(schema)
    values = [{**value, "url": f"http://127.0.0.1:8000/p/{i}"} for i in range(100)]
    arms: dict[str, Check] = {
        "jsonschema": full.errors,
        "jsonschema_memo": memo.errors,
        "jsonschema_rs": _rs(schema),
    }
    samples: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(rounds):
        for arm, check in arms.items():
            t0 = time.perf_counter_ns()
            for v in values:
                check(v)
            samples[arm].append((time.perf_counter_ns() - t0) / len(values) / 1000)
    med = {arm: statistics.median(s) for arm, s in samples.items()}
    return {
        **{f"{arm}_us": round(us, 2) for arm, us in med.items()},
        "memo_vs_jsonschema": round(med["jsonschema_memo"] / med["jsonschema"], 4),
        "rs_vs_memo": round(med["jsonschema_rs"] / med["jsonschema_memo"], 4),
    }


class _JsonschemaContract(Contract):
    """A contract without jsonschema-rs in front: jsonschema checks every value."""

    def __init__(self, schema: dict[str, Any], *, remember: bool = True) -> None:
        super().__init__(schema, remember=remember)
        self.fast = None


async def runtime_cost(n: int) -> dict[str, Any]:
    """The runtime's cost per validator call (p50 through the runtime minus p50 direct)
    with jsonschema-only contracts and with the shipped ones, interleaved call by call."""
    settings = Settings(metrics_port=0)
    specs = load_specs()
    logging.getLogger("aiworker.worker").addHandler(logging.NullHandler())
    logging.getLogger("aiworker.worker").propagate = False
    worker = Validator()
    ctx = WorkerContext(
        request=WorkerRequest.model_validate(REQUEST),
        spec=specs["validator"],
        settings=settings,
        tools=Toolbox({}, frozenset(), None),
        attempt=1,
        deadline=time.monotonic() + 1e9,
        max_tokens=None,
    )
    shipped = WorkerRuntime(settings, specs, metrics=WorkerMetrics(CollectorRegistry()))
    alone = WorkerRuntime(settings, specs, metrics=WorkerMetrics(CollectorRegistry()))
    js_contracts: dict[int, Contract] = {}

    def js_contract(schema: dict[str, Any], *, remember: bool = False) -> Contract:
        hit = js_contracts.get(id(schema))
        if hit is None:
            hit = js_contracts[id(schema)] = _JsonschemaContract(schema, remember=remember)
        return hit

    alone.contract = js_contract  # type: ignore[method-assign]
    runtimes = {"jsonschema": alone, "contract": shipped}

    async def through(runtime: WorkerRuntime) -> None:
        with observe_call(worker.worker_id, runtime.metrics):
            await runtime.run(worker, REQUEST)

    for _ in range(200):  # warm caches on every path
        await worker.execute(ctx, REQUEST["input"])
        for runtime in runtimes.values():
            await through(runtime)
    samples: dict[str, list[float]] = {"direct": [], **{k: [] for k in runtimes}}
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await worker.execute(ctx, REQUEST["input"])
        samples["direct"].append((time.perf_counter_ns() - t0) / 1000)
        for arm, runtime in runtimes.items():
            t0 = time.perf_counter_ns()
            await through(runtime)
            samples[arm].append((time.perf_counter_ns() - t0) / 1000)
    med = {arm: statistics.median(s) for arm, s in samples.items()}
    cost = {arm: med[arm] - med["direct"] for arm in runtimes}
    return {
        "calls": n,
        "direct_p50_us": round(med["direct"], 1),
        "jsonschema_us": round(cost["jsonschema"], 1),
        "contract_us": round(cost["contract"], 1),
        "contract_vs_jsonschema": round(cost["contract"] / cost["jsonschema"], 3),
    }


async def run(quick: bool = False) -> dict[str, Any]:
    per_call = await runtime_cost(1000 if quick else 6000)
    return {
        "jsonschema_rs": importlib.metadata.version("jsonschema-rs"),
        # the headline: the runtime's cost per call with the shipped contracts (jsonschema-rs
        # in front) against jsonschema-only contracts
        "ratio": per_call["contract_vs_jsonschema"],
        "step_path": step_path(rounds=5 if quick else 15, n=100 if quick else 400),
        "input_memo": input_memo(rounds=5 if quick else 15),
        "runtime_per_call": per_call,
        "command": ".venv/bin/python -m bench.schemas" + (" --quick" if quick else ""),
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run)
