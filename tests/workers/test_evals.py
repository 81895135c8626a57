"""Evals from history, end to end, on the real dev server with the bundled local
model (SmolLM2-135M behind llama-server, fixtures/local_model.py).

Runs of ``examples/prompts/classify-ticket.json`` are recorded (one of them
escalated and approved with corrected outputs), ``aiworker eval dataset``
collects them, ``aiworker eval run`` runs a changed prompt version against them
(each command its own process, as a user or a CI job runs it), and the test
recomputes the report's figures from the items it stores. A candidate that
breaks the worker's output schema fails the gate (exit 1).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, installed_workers, running_stack
from prometheus_client import CollectorRegistry
from support.procs import run_cli_module, worker_env
from support.waiting import wait_until
from temporalio.client import Client

from aiworker.activities.llm import LlmMetrics
from aiworker.config.settings import Settings
from aiworker.workers.client.client import send_review
from aiworker.workers.devstack.modelserver import MODEL_NAME, ModelServer
from aiworker.workers.evals.report import bootstrap_ci
from aiworker.workers.process.resources import build_language_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "prompts"
WORKER = "classify-ticket"
TICKETS = [
    ("Checkout page returns 500 for everyone", "None of our customers can pay since 09:10."),
    ("Charged twice for March", "My card was charged two times for invoice INV-2291."),
    ("Dark mode?", "Any plans for a dark theme in the dashboard?"),
]
REVIEWED = ("Cannot log in", "The login form says my password is wrong after a reset.")
FIXED = {"category": "account", "priority": "high", "summary": "Login fails after a reset."}


@dataclass
class EvalStack:
    stack: Stack
    env: dict[str, str]
    specs: Path
    tmp: Path

    async def cli(self, *argv: str) -> tuple[int, str, str]:
        done = await asyncio.to_thread(run_cli_module, list(argv), self.env, timeout=300)
        return done.returncode, done.stdout, done.stderr


@pytest_asyncio.fixture
async def evals(
    client: Client, settings: Settings, tmp_path: Path, local_model: ModelServer
) -> AsyncIterator[EvalStack]:
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(EXAMPLES / f"{WORKER}.json", specs)
    s = Settings.model_validate(
        settings.model_dump()
        | {
            "worker_specs": (specs,),
            "llm_base_url": local_model.base_url,
            "llm_model": MODEL_NAME,
        }
    )
    env = worker_env(client, s, s.data_dir)
    env.update(
        AIWORKER_WORKER_SPECS=str(specs),
        AIWORKER_LLM_BASE_URL=local_model.base_url,
        AIWORKER_LLM_MODEL=MODEL_NAME,
    )
    lm = build_language_model(s, {}, llm_metrics=LlmMetrics(CollectorRegistry()))
    try:
        with installed_workers(s, entry_points=()) as ws:
            async with running_stack(client, s, workers=ws, tools={"language_model": lm}) as st:
                yield EvalStack(st, env, specs, tmp_path)
    finally:
        await lm.aclose()


def triage(name: str, subject: str, body: str, **step: Any) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"subject": subject, "body": body},
        "steps": [
            {
                "id": "triage",
                "worker": WORKER,
                "input": {"subject": "${{ inputs.subject }}", "body": "${{ inputs.body }}"},
                **step,
            }
        ],
        "output": {},
    }


def candidate_spec(tmp: Path, name: str, **changes: Any) -> Path:
    raw = json.loads((EXAMPLES / f"{WORKER}.json").read_text("utf-8"))
    raw["version"] = "1.1"
    raw["implementation"]["system"] = (
        "You sort support tickets. Categories: billing, bug, account, feature_request, other. "
        "Priority: urgent, high, normal or low. Reply with JSON: category, priority, summary."
    )
    for key, value in changes.items():
        raw[key] = value
    path = tmp / name
    path.write_text(json.dumps(raw), "utf-8")
    return path


def recomputed(items: list[dict[str, Any]], side: str) -> dict[str, Any]:
    sides = [i[side] for i in items]
    passes = [
        s["checks"]["contract"]
        and s["checks"]["validator"] is not False
        and s["checks"]["agreement"] is not False
        for s in sides
    ]
    latencies = [s["latency_ms"] for s in sides if s["latency_ms"] is not None]
    codes = Counter(s["error_code"] for s in sides if s["error_code"])
    return {
        "passes": passes,
        "pass_rate": round(sum(passes) / len(sides), 4),
        "pass_rate_ci": bootstrap_ci(passes),
        "tokens": sum(s["tokens"] for s in sides),
        "cost_usd": round(sum(s["cost_usd"] for s in sides), 8),
        "latency_ms_p50": round(statistics.median(latencies), 3) if latencies else None,
        "error_codes": dict(codes),
    }


async def test_dataset_from_history_then_a_changed_prompt_evaluated_and_gated(
    evals: EvalStack, client: Client
) -> None:
    stack = evals.stack
    name = f"triage-{uuid.uuid4().hex[:8]}"
    for subject, body in TICKETS:
        handle = await stack.start(triage(name, subject, body))
        assert (await handle.result()).status == "succeeded"
    # one run whose step a validator fails (only the reviewer's summary passes it):
    # escalated, approved with corrected outputs
    only_fixed = {"properties": {"summary": {"const": FIXED["summary"]}}}
    never = {"schema": only_fixed, "max_attempts": 1}
    reviewed = await stack.start(triage(name, *REVIEWED, validate=never, on_failure="escalate"))

    async def awaiting() -> bool:
        d = await reviewed.describe()
        return any(p.value == "awaiting_review" for p in d.typed_search_attributes)

    await wait_until(awaiting, "the reviewed run to await review", timeout=120)
    await send_review(client, reviewed.id, "approve", outputs=FIXED, reviewer="qa")
    assert (await reviewed.result()).status == "succeeded"

    # --- the dataset: same query, same bytes -------------------------------------
    ds = evals.tmp / "ds.jsonl"

    async def dataset_of_four() -> bool:
        code, _, errs = await evals.cli(
            "eval", "dataset", "--worker", WORKER, "--pipeline", name, "-o", str(ds)
        )
        assert code in (0, 3), errs
        return code == 0 and len(ds.read_bytes().splitlines()) == 5

    await wait_until(dataset_of_four, "four calls in visibility", timeout=60, interval=0.5)
    first = ds.read_bytes()
    code, _, errs = await evals.cli(
        "eval", "dataset", "--worker", WORKER, "--pipeline", name, "--tenant", "acme",
        "--since", "1h", "-o", str(ds),
    )  # fmt: skip
    assert code == 0, errs
    # the same query again: the same bytes
    code, _, errs = await evals.cli(
        "eval", "dataset", "--worker", WORKER, "--pipeline", name, "-o", str(ds)
    )
    assert code == 0 and ds.read_bytes() == first, errs
    # a version nobody recorded: nothing matches (exit 3), naming the versions there are
    code, _, errs = await evals.cli(
        "eval", "dataset", "--worker", WORKER, "--pipeline", name, "--version", "9",
        "-o", str(evals.tmp / "none.jsonl"),
    )  # fmt: skip
    assert code == 3 and "its recorded versions are 1 (not_found)" in errs, errs
    header, *lines = first.splitlines()
    assert json.loads(header)["items"] == 4
    items = [json.loads(line) for line in lines]
    # the same calls (the header names the query, so it differs: the items do not)
    assert ds.read_bytes().splitlines()[1:] == lines
    assert [i["input"]["subject"] for i in items] == [t[0] for t in [*TICKETS, REVIEWED]]
    gold = [i for i in items if i["review"]]
    assert len(gold) == 1 and gold[0]["review"]["outputs"] == FIXED
    assert all(i["status"] == "succeeded" and i["usage"]["output_tokens"] > 0 for i in items)

    # --- a changed prompt version: the gate holds --------------------------------
    cand = candidate_spec(evals.tmp, "v1.1.json")
    report_file, md = evals.tmp / "report.json", evals.tmp / "report.md"
    code, out, errs = await evals.cli(
        "eval", "run", str(ds), "--candidate", str(cand), "--compare", "summary=ignore",
        "--max-pass-drop", "1", "--report", str(report_file), "--markdown", str(md),
    )  # fmt: skip
    assert code == 0, errs + out
    report = json.loads(report_file.read_text("utf-8"))
    assert set(report) >= {"baseline", "candidate", "items", "gate"}
    assert report["gate"] == {"passed": True, "reasons": []}
    assert "Gate: passed" in out and out == md.read_text("utf-8")
    rows = report["items"]
    assert [r["id"] for r in rows] == [i["id"] for i in items]
    # the baseline is the dataset: its tokens and latency are the recorded ones
    assert [r["baseline"]["tokens"] for r in rows] == [
        i["usage"]["input_tokens"] + i["usage"]["output_tokens"] for i in items
    ]
    assert [r["baseline"]["latency_ms"] for r in rows] == [i["duration_ms"] for i in items]
    # the gold of the reviewed item is the reviewer's, the others' the recorded output
    assert [r["gold_source"] for r in rows] == ["recorded"] * 3 + ["review"]
    assert rows[3]["gold"] == FIXED
    for side in ("baseline", "candidate"):
        mine, theirs = recomputed(rows, side), report[side]
        assert [r[side]["passed"] for r in rows] == mine["passes"]
        for key in ("pass_rate", "pass_rate_ci", "tokens", "cost_usd", "error_codes"):
            assert theirs[key] == mine[key], (side, key)
        # the items' latencies are rounded to the microsecond, the report's p50 is
        # taken before rounding: a median of two may differ in the last digit
        assert theirs["latency_ms_p50"] == pytest.approx(mine["latency_ms_p50"], abs=0.0011)
    # each agreement check recomputed from the gold and the outputs
    for r in rows:
        for side in ("baseline", "candidate"):
            out_ = r[side]["output"]
            ok = r[side]["status"] in ("succeeded", "partial") and out_ is not None
            fields = r[side]["checks"]["fields"]
            assert fields == {
                k: ok and k in out_ and (k == "summary" or out_[k] == v)
                for k, v in r["gold"].items()
            }
    assert report["candidate"]["tokens"] > 0
    # one item, inspectable
    code, out, _ = await evals.cli("eval", "show", str(report_file), rows[3]["id"])
    assert code == 0 and json.loads(out)["gold"] == FIXED

    # --- a candidate that breaks the worker's output schema fails the gate ----------
    raw = json.loads(cand.read_text("utf-8"))
    schema = raw["output_schema"]
    schema["properties"]["urgency"] = schema["properties"].pop("priority")
    schema["required"] = ["category", "urgency", "summary"]
    impl = raw["implementation"]
    for shot in impl["few_shot"]:
        shot["output"]["urgency"] = shot["output"].pop("priority")
    broken = candidate_spec(evals.tmp, "broken.json", output_schema=schema, implementation=impl)
    code, out, errs = await evals.cli(
        "eval", "run", str(ds), "--candidate", str(broken), "--max-pass-drop", "0.1",
        "--compare", "summary=ignore", "--report", str(report_file),
    )  # fmt: skip
    assert code == 1, errs + out
    report = json.loads(report_file.read_text("utf-8"))
    assert report["candidate"]["pass_rate"] == 0.0
    assert not any(r["candidate"]["checks"]["contract"] for r in report["items"])
    (reason,) = report["gate"]["reasons"]
    assert "pass rate dropped" in reason and "Gate: FAILED" in out
