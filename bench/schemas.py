"""The contracts' validator against jsonschema-rs, on the step path and per runtime call.

aiworker applies every JSON Schema with jsonschema behind
:mod:`aiworker.schemas.safe_schema`. This part times, in one run and
interleaved, the checks a step makes (the built-in specs' input and output
schemas on the values a step sends and returns) with that validator and with
jsonschema-rs configured to keep the same guarantees as far as it can: its
linear-time ``regex`` engine (``RegexOptions``), a retriever that refuses every
``$ref`` retrieval, and the same format checks (``safe_schema.FORMATS``' Python
functions, which replace jsonschema-rs's own). Then the runtime's own cost per
call (``bench/overhead.py``'s validator call) with each validator behind the
runtime's contracts, and web-scrape's input through the contracts' memo of
valid parts (``input_memo``). Figures are medians in microseconds and ratios.

jsonschema-rs comes with the ``bench`` extra (``pip install -e '.[bench]'``);
aiworker never imports it. Why it is not the validator (yet): the docstring of
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
from aiworker.activities.contracts import Contract
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

try:
    import jsonschema_rs
except ImportError:  # the bench extra is not installed
    jsonschema_rs = None

Check = Callable[[Any], list[Any]]


def _refuse(uri: str) -> Any:
    raise ValueError(f"{uri}: aiworker never fetches schemas")


def _format(check: tuple[Callable[[Any], Any], Any]) -> Callable[[str], bool]:
    func, raises = check

    def conforms(value: str) -> bool:
        try:
            return bool(func(value))
        except raises:
            return False

    return conforms


def rs_validator(schema: dict[str, Any]) -> Any:
    """jsonschema-rs with no retrieval, the linear-time engine and aiworker's formats."""
    assert jsonschema_rs is not None
    formats = {name: _format(c) for name, c in safe_schema.FORMATS.checkers.items()}
    return jsonschema_rs.validator_for(
        schema,
        retriever=_refuse,
        pattern_options=jsonschema_rs.RegexOptions(),
        formats=formats,
        validate_formats=True,
    )


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


def _arms(schema: dict[str, Any]) -> dict[str, Check]:
    js = safe_schema.cached_validator(schema)
    rs = rs_validator(schema)
    return {
        "jsonschema": lambda v: safe_schema.errors(js, v),
        "jsonschema_rs": lambda v: [] if rs.is_valid(v) else list(rs.iter_errors(v)),
    }


def step_path(rounds: int, n: int) -> dict[str, Any]:
    """Per check, the median us of each validator over ``rounds`` interleaved rounds."""
    out: dict[str, Any] = {}
    for name, (schema, value) in _cases().items():
        arms = _arms(schema)
        for arm, check in arms.items():
            if check(value):  # both must find the value valid, or the race is unfair
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
            "jsonschema_us": round(med["jsonschema"], 2),
            "jsonschema_rs_us": round(med["jsonschema_rs"], 2),
            "rs_vs_jsonschema": round(med["jsonschema_rs"] / med["jsonschema"], 4),
        }
    return out


def input_memo(rounds: int) -> dict[str, Any]:
    """web-scrape's input as a crawl sends it (one extraction spec, a new url each
    call): jsonschema in full, through the contract's memo of valid parts
    (:mod:`aiworker.activities.contracts`), and jsonschema-rs; median us per call."""
    schema, value = _cases()["web-scrape input"]
    full, memo, rs = Contract(schema, remember=False), Contract(schema), rs_validator(schema)
    values = [{**value, "url": f"http://127.0.0.1:8000/p/{i}"} for i in range(100)]
    arms: dict[str, Check] = {
        "jsonschema": full.errors,
        "jsonschema_memo": memo.errors,
        "jsonschema_rs": lambda v: [] if rs.is_valid(v) else list(rs.iter_errors(v)),
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


class _RsContract(Contract):
    """A contract whose errors come from jsonschema-rs (valid values: no errors)."""

    def __init__(self, schema: dict[str, Any], *, remember: bool = True) -> None:
        super().__init__(schema, remember=False)
        self.rs = rs_validator(schema)

    def errors(self, value: Any) -> list[Any]:
        return [] if self.rs.is_valid(value) else list(self.rs.iter_errors(value))


async def runtime_cost(n: int) -> dict[str, Any]:
    """The runtime's cost per validator call (p50 through the runtime minus p50 direct)
    with each validator behind its contracts, interleaved call by call."""
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
    rs = WorkerRuntime(settings, specs, metrics=WorkerMetrics(CollectorRegistry()))
    rs_contracts: dict[int, _RsContract] = {}

    def rs_contract(schema: dict[str, Any], *, remember: bool = False) -> Contract:
        hit = rs_contracts.get(id(schema))
        if hit is None:
            hit = rs_contracts[id(schema)] = _RsContract(schema)
        return hit

    rs.contract = rs_contract  # type: ignore[method-assign]
    runtimes = {"jsonschema": shipped, "jsonschema_rs": rs}

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
        "jsonschema_rs_us": round(cost["jsonschema_rs"], 1),
        "rs_vs_jsonschema": round(cost["jsonschema_rs"] / cost["jsonschema"], 3),
    }


async def run(quick: bool = False) -> dict[str, Any]:
    if jsonschema_rs is None:
        return {"skipped": "jsonschema-rs is not installed: pip install -e '.[bench]'"}
    per_call = await runtime_cost(1000 if quick else 6000)
    return {
        "jsonschema_rs": importlib.metadata.version("jsonschema-rs"),
        # the headline: jsonschema-rs's runtime cost per call against jsonschema's
        "ratio": per_call["rs_vs_jsonschema"],
        "step_path": step_path(rounds=5 if quick else 15, n=100 if quick else 400),
        "input_memo": input_memo(rounds=5 if quick else 15),
        "runtime_per_call": per_call,
        "command": ".venv/bin/python -m bench.schemas" + (" --quick" if quick else ""),
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run)
