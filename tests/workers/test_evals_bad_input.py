"""Bad input to evals, and the judge: each refusal a clear message with a stable
code naming the line, item or field; the other items still scored.

The dataset and candidate checks run on their own (no server); the item that
fails the candidate's input schema and the judge that answers off its schema run
through a real eval workflow on the dev server, the candidate and the judge
answering from a loopback model that replies what the test scripts.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, installed_workers, running_stack
from fixtures.llm_fakes import FakeProvider, fake  # noqa: F401  (module fixture)
from prometheus_client import CollectorRegistry
from temporalio.client import Client

from aiworker.activities.llm import LlmMetrics
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas.evals import EvalJudge
from aiworker.schemas.spec import WorkerSpec
from aiworker.workers.evals.dataset import DatasetError, parse
from aiworker.workers.evals.report import (
    Comparison,
    Scoring,
    Thresholds,
    bootstrap_ci,
    build_report,
    gate,
    parse_compare,
    token_f1,
)
from aiworker.workers.evals.run import (
    CandidateChoice,
    EvalError,
    choose_candidate,
    eval_input,
    eval_workflow_id,
    read_judge_file,
    start_eval,
)
from aiworker.workers.process.resources import build_language_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "prompts"
WORKER = "classify-ticket"
GOOD = {"category": "bug", "priority": "urgent", "summary": "Checkout fails with 500 for all."}
TICKET = {"subject": "Checkout is down", "body": "Nobody can pay."}


def line(**item: Any) -> bytes:
    return (json.dumps({"id": "a", "input": TICKET, **item}) + "\n").encode()


# --- the dataset file ---------------------------------------------------------


def test_a_malformed_line_is_named_by_its_number() -> None:
    good = line(id="a") + line(id="b")
    for bad, why in (
        (b"{not json\n", "not valid JSON"),
        (line(id="c", input="a string"), "input: Input should be a valid dictionary"),
        (line(id="c", surprise=1), "surprise: Extra inputs are not permitted"),
        (line(id="a"), "id 'a' is also on line 1"),
        (b"\n", "empty line"),
    ):
        with pytest.raises(DatasetError) as e:
            parse(good + bad, "ds.jsonl")
        assert (e.value.line, e.value.code) == (3, "invalid_input")
        assert str(e.value).startswith("dataset line 3: ") and why in str(e.value), str(e.value)


def test_a_hand_written_dataset_loads_and_a_written_one_checks_its_hash() -> None:
    hand = parse(line(id="a", output=GOOD) + line(id="b"))
    assert [i.id for i in hand.items] == ["a", "b"] and hand.items[0].gold == GOOD
    assert hand.items[1].gold is None and len(hand.sha256) == 64
    # a header that names the items' hash: a changed item no longer matches it
    header = {"aiworker_dataset": 1, "sha256": hand.sha256, "items": 2, "query": {}}
    body = line(id="a", output=GOOD) + line(id="b")
    assert parse(json.dumps(header).encode() + b"\n" + body).sha256 == hand.sha256
    with pytest.raises(DatasetError, match="do not match the header's sha256"):
        parse(json.dumps(header).encode() + b"\n" + line(id="a") + line(id="b"))
    with pytest.raises(DatasetError, match="no items"):
        parse(b"")


# --- the candidate -----------------------------------------------------------


def specs() -> dict[str, WorkerSpec]:
    return {**load_specs(), WORKER: WorkerSpec.from_file(EXAMPLES / f"{WORKER}.json")}


def test_candidates_that_cannot_run_are_refused_with_a_stable_code(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    raw = json.loads((EXAMPLES / f"{WORKER}.json").read_text("utf-8"))
    raw["output_schema"]["required"] = ["nothing"]
    broken.write_text(json.dumps(raw))
    known = specs()
    cases: list[tuple[CandidateChoice, str | None, str, str]] = [
        (CandidateChoice(spec_file=str(broken)), WORKER, "invalid_input", "invalid candidate spec"),
        (CandidateChoice(spec_file=str(tmp_path / "none.json")), WORKER, "not_found", "no candid"),
        (CandidateChoice(model="gpt-nobody"), WORKER, "not_found", "unknown model alias"),
        (CandidateChoice(model="default"), "no-such-worker", "not_found", "unknown worker"),
        (CandidateChoice(model="default"), "validator", "invalid_input", "no model alias"),
        (CandidateChoice(task_queue="q"), "publish", "access_denied", "side effects"),
        (
            CandidateChoice(task_queue=known["publish"].task_queue, allow_side_effects=True),
            "publish",
            "access_denied",
            "never calls it on its own queue",
        ),
    ]
    for choice, worker, code, says in cases:
        with pytest.raises(EvalError) as e:
            choose_candidate(choice, worker, known, {"default"})
        assert (e.value.code, says in str(e.value)) == (code, True), str(e.value)
    # with the flag, a side-effect worker runs on a sandbox queue only
    ok = choose_candidate(
        CandidateChoice(task_queue="sandbox", allow_side_effects=True), "publish", known, None
    )
    assert (ok.mode, ok.task_queue) == ("queue", "sandbox")


def test_a_judge_file_must_give_a_boolean_verdict(tmp_path: Path) -> None:
    judge = tmp_path / "judge.json"
    judge.write_text(json.dumps({"rubric": "Is it right?", "response_schema": {"type": "object"}}))
    with pytest.raises(EvalError, match=r"properties\.pass must be"):
        read_judge_file(str(judge))


# --- scores ------------------------------------------------------------------


def test_comparisons_bootstrap_and_gate() -> None:
    assert parse_compare("summary=token_f1:0.7") == ("summary", Comparison("token_f1", 0.7))
    with pytest.raises(ValueError, match="one of exact"):
        parse_compare("summary=fuzzy")
    assert token_f1("Login fails after reset", "login FAILS after a reset") == pytest.approx(
        2 * 1.0 * 0.8 / 1.8
    )
    flips = [True, False, True, True]
    assert bootstrap_ci(flips) == bootstrap_ci(flips)  # seeded
    lo, hi = bootstrap_ci(flips)
    assert 0 <= lo <= 0.75 <= hi <= 1
    base = {"pass_rate": 0.9, "cost_per_item_usd": 0.01}
    assert gate(base, {"pass_rate": 0.86, "cost_per_item_usd": 0.011}, Thresholds(0.05, 0.2)) == {
        "passed": True,
        "reasons": [],
    }
    failed = gate(base, {"pass_rate": 0.8, "cost_per_item_usd": 0.02}, Thresholds(0.05, 0.2))
    assert not failed["passed"] and len(failed["reasons"]) == 2


# --- through the workflow ----------------------------------------------------


@pytest_asyncio.fixture
async def scripted(
    client: Client, settings: Settings, tmp_path: Path, fake: FakeProvider
) -> AsyncIterator[tuple[Stack, str, str]]:
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    shutil.copy(EXAMPLES / f"{WORKER}.json", spec_dir)
    model, judge = (f"scripted@{uuid.uuid4().hex[:10]}" for _ in range(2))
    models = tmp_path / "models.json"
    models.write_text(
        json.dumps({"models": {"judge": {"base_url": fake.root + "/v1", "model": judge}}})
    )
    s = Settings.model_validate(
        settings.model_dump()
        | {
            "worker_specs": (spec_dir,),
            "llm_base_url": fake.root + "/v1",
            "llm_model": model,
            "models_file": models,
        }
    )
    lm = build_language_model(s, {}, llm_metrics=LlmMetrics(CollectorRegistry()))
    try:
        with installed_workers(s, entry_points=()) as ws:
            async with running_stack(client, s, workers=ws, tools={"language_model": lm}) as st:
                yield st, model, judge
    finally:
        await lm.aclose()


async def test_an_item_off_the_input_schema_and_an_off_schema_judge_leave_the_others_scored(
    client: Client, scripted: tuple[Stack, str, str], fake: FakeProvider
) -> None:
    stack, model, judge_model = scripted
    fake.script(model, json.dumps(GOOD))
    # the judge: item a passes, c answers off its schema, d fails
    fake.script(judge_model, json.dumps({"pass": True}), "no verdict", json.dumps({"pass": False}))
    dataset = parse(
        line(id="a", output=GOOD)
        + line(id="b", input={"body": "no subject"}, output=GOOD)
        + line(id="c", output=GOOD)
        + line(id="d", output=GOOD)
    )
    known = specs()
    cand = choose_candidate(
        CandidateChoice(spec_file=str(EXAMPLES / f"{WORKER}.json")), WORKER, known, None
    )
    judge = EvalJudge(
        model="judge",
        rubric="Say whether the classification is right.",
        response_schema={
            "type": "object",
            "required": ["pass"],
            "properties": {"pass": {"type": "boolean"}},
        },
    )
    inp = eval_input(
        dataset, cand, stack.settings, judge=judge, judge_spec=known["llm-call"], concurrency=1
    )
    handle = await start_eval(client, stack.settings, eval_workflow_id(dataset, inp), inp)
    result = await handle.result()
    a, b, c, d = result.items
    assert (b.status, b.error_code) == ("failed", "invalid_input")
    assert b.error_field is not None and "subject" in (b.error_message or "") + b.error_field
    assert [x.status for x in (a, c, d)] == ["succeeded"] * 3
    assert a.judge is not None and a.judge["passed"] is True
    assert c.judge is not None and c.judge["error_code"] == "invalid_output"
    assert d.judge is not None and d.judge["passed"] is False
    report = build_report(
        dataset.items,
        result.items,
        Scoring(output_schema=cand.spec.output_schema),
        Thresholds(),
        {},
    )
    passed = {r["id"]: r["candidate"]["passed"] for r in report["items"]}
    assert passed == {"a": True, "b": False, "c": True, "d": False}
    assert report["items"][2]["candidate"]["judge_error"] == "invalid_output"
    assert report["candidate"]["error_codes"] == {"invalid_input": 1}
