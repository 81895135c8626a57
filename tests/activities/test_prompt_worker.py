"""Prompt workers (a spec file, no code) against a loopback OpenAI-compatible
server (``fixtures/llm_fakes.py``): what the model receives, what the worker returns, how
a rejected reply comes back, and the spec files a process refuses at start.

Pipelines with prompt workers: ``tests/workflows/test_prompt_pipeline.py``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from fixtures.llm_fakes import FakeProvider, fake  # noqa: F401  (module fixture)
from jsonschema import Draft202012Validator
from prometheus_client import CollectorRegistry
from temporalio.exceptions import ApplicationError

from aiworker.activities.llm import LanguageModel, LlmMetrics, load_registry
from aiworker.activities.prompt import PromptWorker, render
from aiworker.config import catalog
from aiworker.config.settings import Settings
from aiworker.schemas.spec import FEEDBACK_SCHEMA, WorkerSpec
from aiworker.testing import run_worker
from aiworker.workers.process.worker_set import PluginError, load_workers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "prompts"
JSON_SCHEMAS = ROOT / "schemas" / "json"
TICKET = {
    "subject": "Checkout page returns 500 for everyone",
    "body": "Since 09:10 UTC none of our customers can pay.",
}
GOOD = {"category": "bug", "priority": "urgent", "summary": "Checkout fails with 500 for all."}


def example(name: str) -> dict[str, Any]:
    """A spec file of examples/prompts, as JSON."""
    raw: dict[str, Any] = json.loads((EXAMPLES / f"{name}.json").read_text("utf-8"))
    return raw


@dataclass
class Model:
    """The ``default`` alias of one test: a fresh scripted model on the fake."""

    name: str
    lm: LanguageModel
    settings: Settings

    @property
    def tools(self) -> dict[str, Any]:
        return {"language_model": self.lm}


@pytest_asyncio.fixture
async def model(fake: FakeProvider, settings: Settings) -> AsyncIterator[Model]:
    # AIWORKER_LLM_BASE_URL / AIWORKER_LLM_MODEL define the `default` alias,
    # which the example specs name.
    name = f"scripted@{uuid.uuid4().hex[:10]}"
    s = settings.model_copy(update={"llm_base_url": fake.root + "/v1", "llm_model": name})
    lm = LanguageModel(load_registry(s, {}), metrics=LlmMetrics(CollectorRegistry()))
    try:
        yield Model(name, lm, s)
    finally:
        await lm.aclose()


def ticket_worker() -> PromptWorker:
    return PromptWorker(WorkerSpec.from_file(EXAMPLES / "classify-ticket.json"))


async def test_the_model_receives_the_rendered_conversation_and_the_output_schema(
    fake: FakeProvider, model: Model
) -> None:
    worker = ticket_worker()
    spec = worker.spec
    fake.script(model.name, json.dumps(GOOD))
    response = await run_worker(worker, TICKET, tools=model.tools, settings=model.settings)

    assert response.worker_id == "classify-ticket" and response.status == "succeeded"
    assert response.outputs == GOOD
    (sent,) = fake.seen(model.name)
    body = sent.body
    shots = spec.implementation.few_shot  # type: ignore[union-attr]
    system = spec.implementation.system  # type: ignore[union-attr]
    assert body["messages"] == [
        {"role": "system", "content": system},
        {
            "role": "user",
            "content": f"Subject: {shots[0].input['subject']}\nPlan (empty when unknown): "
            f"\n\n{shots[0].input['body']}",
        },
        {"role": "assistant", "content": json.dumps(shots[0].output)},
        {
            "role": "user",
            "content": f"Subject: {shots[1].input['subject']}\nPlan (empty when unknown): "
            f"\n\n{shots[1].input['body']}",
        },
        {"role": "assistant", "content": json.dumps(shots[1].output)},
        {
            "role": "user",
            "content": f"Subject: {TICKET['subject']}\nPlan (empty when unknown): "
            f"\n\n{TICKET['body']}",
        },
    ]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == spec.output_schema
    # the prompt worker's own limits, not llm-call's (1500)
    assert body["max_tokens"] == spec.constraints.max_tokens == 300
    assert body["temperature"] == 0
    # usage: what the provider billed, and one external call
    billed = sum(len(m["content"]) for m in body["messages"]) // 4
    assert response.usage.input_tokens == billed > 0
    assert response.usage.output_tokens == 7
    assert response.usage.external_calls == 1
    assert response.observability.worker_id == "classify-ticket"
    assert response.observability.timeout_seconds == 30

    # a request constraint (what a pipeline's budget has left) tightens max_tokens
    fake.script(model.name, json.dumps(GOOD))
    await run_worker(
        worker,
        {**TICKET, "plan": "pro"},
        tools=model.tools,
        settings=model.settings,
        constraints={"max_tokens": 40},
    )
    last = fake.seen(model.name)[-1].body
    assert last["max_tokens"] == 40
    assert "Plan (empty when unknown): pro\n" in last["messages"][-1]["content"]


async def test_a_reply_that_misses_the_schema_is_invalid_output_and_feedback_reaches_the_model(
    fake: FakeProvider, model: Model
) -> None:
    worker = ticket_worker()
    wrong = {**GOOD, "category": "outage"}
    fake.script(model.name, json.dumps(wrong), json.dumps(GOOD))
    with pytest.raises(ApplicationError) as caught:
        await run_worker(worker, TICKET, tools=model.tools, settings=model.settings)
    err = caught.value
    assert err.type == "invalid_output" and err.non_retryable
    info = err.details[0]
    assert info["field"] == "outputs.json"
    reasons = info["reasons"]
    assert [(r["path"], r["validator"]) for r in reasons] == [("$.category", "enum")]
    assert '"outage" is not one of' in reasons[0]["message"]
    # the rejected reply was billed
    assert info["usage"]["output_tokens"] == 7 and info["usage"]["external_calls"] == 1

    # what the validation loop does next: the same input, with the reasons as feedback
    response = await run_worker(
        worker, {**TICKET, "feedback": reasons}, tools=model.tools, settings=model.settings
    )
    assert response.outputs == GOOD
    first, second = (r.body["messages"] for r in fake.seen(model.name))
    assert second[:-1] == first  # the same conversation, then the feedback turn
    assert second[-1]["role"] == "user"
    assert "rejected" in second[-1]["content"]
    assert "$.category" in second[-1]["content"] and '"outage"' in second[-1]["content"]


async def test_replies_that_are_not_the_object_asked_for_are_invalid_output(
    fake: FakeProvider, model: Model
) -> None:
    worker = ticket_worker()
    for reply, validator in (
        ("Sure! It is a bug, and urgent.", "json"),
        (json.dumps({"category": "bug"}), "required"),
        (json.dumps([GOOD]), "type"),
    ):
        fake.script(model.name, reply)
        with pytest.raises(ApplicationError) as caught:
            await run_worker(worker, TICKET, tools=model.tools, settings=model.settings)
        assert caught.value.type == "invalid_output", reply
        assert caught.value.details[0]["reasons"][0]["validator"] == validator, reply


async def test_an_unknown_model_alias_is_invalid_input_naming_the_spec_field(
    fake: FakeProvider, model: Model
) -> None:
    raw = example("classify-ticket")
    raw["implementation"]["model"] = "gpt-nonexistent"
    worker = PromptWorker(WorkerSpec.model_validate(raw))
    with pytest.raises(ApplicationError) as caught:
        await run_worker(worker, TICKET, tools=model.tools, settings=model.settings)
    err = caught.value
    assert err.type == "invalid_input" and err.non_retryable
    assert err.details[0]["field"] == "implementation.model"
    assert "'gpt-nonexistent'" in err.message and "known: default" in err.message
    assert "AIWORKER_MODELS_FILE" in err.message
    assert fake.seen(model.name) == []


async def test_a_process_without_a_model_says_so_with_a_stable_code(model: Model) -> None:
    with pytest.raises(ApplicationError) as caught:
        await run_worker(ticket_worker(), TICKET, settings=model.settings)
    assert caught.value.type == "tool_not_allowed"
    assert "not available in this process" in caught.value.message


def test_templates_render_by_one_rule() -> None:
    raw = example("tag-product")
    worker = PromptWorker(WorkerSpec.model_validate(raw))
    shoe = {"product": {"name": "Trail shoe", "attributes": {"color": "red", "drop_mm": 6}}}
    prompt = worker.llm_input(shoe)["messages"][-1]["content"]
    # a non-string value as compact JSON; max_tags absent: its schema default (5)
    assert prompt.startswith(
        'Product: Trail shoe\nAttributes (JSON): {"color":"red","drop_mm":6}\n'
        "Tags wanted (at most): 5\n"
    )
    # an optional value the input leaves out, with no default: empty text
    bare = worker.llm_input({"product": {"name": "Mug"}, "max_tags": 2})["messages"][-1]
    assert "Attributes (JSON): \nTags wanted (at most): 2\n" in bare["content"]

    scope = {"a": "x", "n": 3, "flag": True, "none": None, "list": [1, "two"], "feedback": ["r"]}
    assert render("${{ input.n }}", scope) == "3"  # a lone reference is text too
    assert render("${{input.flag}}/${{ input.none }}", scope) == "true/null"
    assert render("${{ input.list[1] }} ${{ input.list }}", scope) == 'two [1,"two"]'
    assert render("${{ input.missing.deeper }}|${{ input.list[9] }}", scope) == "|"
    assert render("keep $${{ input.a }} and ${{ input.a }}", scope) == "keep ${{ input.a }} and x"
    # the whole input, without the feedback (it has a turn of its own)
    assert json.loads(render("${{ input }}", scope)) == {
        k: v for k, v in scope.items() if k != "feedback"
    }
    # a literal is no reference: the load check lets it through, rendering unescapes it
    raw["implementation"]["prompt"] = "Write $${{ input.anything }} for ${{ input.product.name }}"
    literal = PromptWorker(WorkerSpec.model_validate(raw)).llm_input(shoe)["messages"][-1]
    assert literal["content"] == "Write ${{ input.anything }} for Trail shoe"
    # text from the input is never expanded again
    assert render("${{ input.a }}", {"a": "${{ input.b }}", "b": "secret"}) == "${{ input.b }}"


def test_feedback_is_part_of_every_prompt_workers_input() -> None:
    raw = example("classify-ticket")
    spec = WorkerSpec.model_validate(raw)
    assert spec.input_schema["properties"]["feedback"] == FEEDBACK_SCHEMA
    # additionalProperties false stays: only feedback is added
    assert spec.input_schema["additionalProperties"] is False
    # a spec dumped and read again (aiworker workers --json) is the same spec
    assert WorkerSpec.model_validate(spec.model_dump(mode="json")) == spec
    # a schema with no properties at all accepts feedback too
    raw["input_schema"] = {"type": "object", "additionalProperties": False}
    raw["implementation"] = {"kind": "prompt", "prompt": "Say hello."}
    raw["examples"] = []
    spec = WorkerSpec.model_validate(raw)
    assert list(spec.input_schema["properties"]) == ["feedback"]
    # the worker shows the model at most 50 reasons, whatever the validator sent
    reasons = [{"path": f"$.f{i}", "message": "wrong"} for i in range(120)]
    sent = PromptWorker(spec).llm_input({"feedback": reasons})
    assert sent["feedback"] == reasons[:50]


# -- bad spec files: the process refuses to start ------------------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(raw: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = raw
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return apply


BAD_SPECS = [
    pytest.param(
        _set("implementation.prompt", "Subject: ${{ input.subjet }}"),
        ["implementation.prompt", "${{ input.subjet }}", "'subjet'", "declared: body, "],
        id="template-names-an-undeclared-field",
    ),
    pytest.param(
        _set("implementation.few_shot.0.input", {"subject": "Charged twice"}),
        ["implementation.few_shot[0].input", "'body' is a required property"],
        id="few-shot-input-breaks-input-schema",
    ),
    pytest.param(
        _set("implementation.few_shot.1.output.priority", "whenever"),
        ["implementation.few_shot[1].output.priority", "'whenever' is not one of"],
        id="few-shot-output-breaks-output-schema",
    ),
    pytest.param(
        _set("constraints.tools_allowed", []),
        ["constraints.tools_allowed", "language_model"],
        id="no-language-model-allowed",
    ),
    pytest.param(
        _set("constraints.max_external_calls", 0),
        ["constraints.max_external_calls", "allows none"],
        id="no-external-call-allowed",
    ),
    pytest.param(
        _set("constraints.max_tokens", 0),
        ["constraints.max_tokens", "no tokens"],
        id="no-output-tokens-allowed",
    ),
    pytest.param(
        _set("output_schema", {"type": "string", "maxLength": 200}),
        ["output_schema", '"type": "object"'],
        id="output-schema-not-an-object",
    ),
    pytest.param(
        _set("implementation.prompt", "Subject: ${{ input. }}"),
        ["implementation.prompt", "bad reference"],
        id="malformed-reference",
    ),
    pytest.param(
        _set("implementation.system", "Triage ${{ inputs.subject }}"),
        ["implementation.system", "must start with input"],
        id="pipeline-root-in-a-template",
    ),
    pytest.param(
        _set("implementation.prompt", "${{ }}"),
        ["implementation.prompt", "empty reference"],
        id="empty-reference",
    ),
    pytest.param(
        _set("implementation.prompt", "${{ input[0] }}"),
        ["implementation.prompt", "name a field"],
        id="template-indexes-the-input",
    ),
    pytest.param(
        _set("implementation.model", "gpt 4o; rm -rf"),
        ["implementation.model", "should match pattern"],
        id="model-alias-not-a-name",
    ),
    pytest.param(
        _set("input_schema.properties.feedback", {"type": "string"}),
        ["input_schema.properties.feedback", "reserved"],
        id="feedback-redeclared",
    ),
    pytest.param(
        _set("examples.0.network", False),
        ["examples[0].network", '"network": true'],
        id="example-not-marked-network",
    ),
    pytest.param(
        _set("implementation.kind", "promt"),
        ["implementation", "promt"],
        id="unknown-implementation-kind",
    ),
]


def _load(settings: Settings, folder: Path) -> Any:
    # no installed plugins: another package in this venv must not change the outcome
    return load_workers(settings.model_copy(update={"worker_specs": (folder,)}), entry_points=())


@pytest.mark.parametrize(("edit", "expected"), BAD_SPECS)
def test_a_bad_prompt_spec_stops_the_process_naming_file_and_field(
    tmp_path: Path,
    settings: Settings,
    edit: Callable[[dict[str, Any]], None],
    expected: list[str],
) -> None:
    folder = tmp_path / "specs"
    folder.mkdir()
    # a good spec sorts first: it must not be registered when a later one is bad
    good = example("tag-product")
    (folder / "tag-product.json").write_text(json.dumps(good))
    raw = deepcopy(example("classify-ticket"))
    edit(raw)
    (folder / "classify-ticket.json").write_text(json.dumps(raw))
    before = dict(catalog.current_specs())
    with pytest.raises(PluginError) as caught:
        _load(settings, folder)
    message = str(caught.value)
    assert f"worker spec {folder / 'classify-ticket.json'}: " in message
    assert "AIWORKER_WORKER_SPECS" in message
    for part in expected:
        assert part in message, (part, message)
    assert dict(catalog.current_specs()) == before
    assert "tag-product" not in catalog.current_specs()


def test_nested_references_are_checked_as_far_as_the_schema_is_closed(
    tmp_path: Path, settings: Settings
) -> None:
    folder = tmp_path / "specs"
    folder.mkdir()
    raw = example("tag-product")
    # product is a closed object: a typo in its fields is caught at load
    raw["implementation"]["prompt"] = "Product: ${{ input.product.nmae }}"
    (folder / "tag-product.json").write_text(json.dumps(raw))
    with pytest.raises(PluginError) as caught:
        _load(settings, folder)
    assert "implementation.prompt: ${{ input.product.nmae }} names 'nmae', which input.product" in (
        str(caught.value)
    )
    assert "declared: attributes, name" in str(caught.value)
    # attributes is an open object: any key in it may be there
    raw["implementation"]["prompt"] = "Color: ${{ input.product.attributes.color }}"
    (folder / "tag-product.json").write_text(json.dumps(raw))
    assert "tag-product" in _load(settings, folder).served


def test_a_spec_file_named_after_another_worker_is_refused(
    tmp_path: Path, settings: Settings
) -> None:
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "classify.json").write_text(json.dumps(example("classify-ticket")))
    with pytest.raises(PluginError) as caught:
        _load(settings, folder)
    message = str(caught.value)
    assert str(folder / "classify.json") in message
    assert "declares worker_id 'classify-ticket'" in message
    assert "classify-ticket" not in catalog.current_specs()


def test_the_example_specs_load_as_served_workers(tmp_path: Path, settings: Settings) -> None:
    # what an editor or a plugin's CI checks them against, without aiworker
    exported = json.loads((JSON_SCHEMAS / "worker-spec.schema.json").read_text("utf-8"))
    for path in sorted(EXAMPLES.glob("*.json")):
        Draft202012Validator(exported).validate(json.loads(path.read_text("utf-8")))
    ws = _load(settings, EXAMPLES)
    for worker_id, queue in (
        ("classify-ticket", "support-triage"),
        ("tag-product", "aiworker-llm"),
    ):
        worker = ws.served[worker_id]
        assert isinstance(worker, PromptWorker)
        assert ws.origin(worker_id) == f"file {EXAMPLES / (worker_id + '.json')}"
        assert worker.spec.task_queue == queue
        assert worker.activity_options()["retry_policy"].maximum_attempts == (
            worker.spec.retries.max_attempts
        )
