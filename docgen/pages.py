"""The generated half of ``docs/``: pages built from the models, the worker specs,
the error table and the settings, so that they cannot drift from the code.

``make docs`` (``python -m docgen``) writes them and ``python -m docgen check``
reports a page that differs (the tests run the check too). The generator lives
in the source tree only: it is not part of the installed package. A page
starts by saying it is generated and how to regenerate it; the hand-written
pages (``docs/*.md``) link to these under ``docs/reference/``. What no model
holds (when an error happens, what a setting means) lives in
:mod:`docgen.notes`; a code, setting or worker without its line there fails
the generation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

from aiworker.config.catalog import load_specs
from aiworker.config.settings import ENV_PREFIX, Settings, SettingsError
from aiworker.schemas import safe_schema, tenants
from aiworker.schemas.callbacks import Wait
from aiworker.schemas.caps import HARD_MAX_STEPS, SETTING_OF, Caps
from aiworker.schemas.causes import ErrorCause, PipelineError
from aiworker.schemas.errors import RETRYABLE, ErrorCode
from aiworker.schemas.flow import Batch, Debounce, Flow, Throttle
from aiworker.schemas.names import TENANT_PATTERN
from aiworker.schemas.pipeline import (
    Budget,
    Concurrency,
    PipelineResult,
    PipelineSpec,
    ResumeFrom,
    ReviewDecision,
    Step,
    StepResult,
    StepRetry,
    StepStatus,
    TerminalStatus,
    Validation,
)
from aiworker.schemas.protocol import CachePolicy, Usage
from aiworker.schemas.spec import WorkerSpec
from docgen import notes
from docgen.render import (
    DASH,
    code,
    jsonable,
    model_rows,
    model_section,
    prose,
    schema_rows,
    table,
)

# The checkout's docs folder: generated pages exist only in a source tree.
ROOT = Path(__file__).resolve().parent.parent
DOCS_DIR = ROOT / "docs"
REFERENCE = "reference"


def _header(title: str, *sources: str) -> str:
    names = " and ".join(f"`{s}`" for s in sources)
    return (
        f"<!-- Generated from {', '.join(sources)} by `make docs`; "
        "do not edit by hand. -->\n"
        f"# {title}\n\n"
        f"> Generated from {names}. To change this page, change the source and run "
        "`make docs`; `python -m docgen check` reports a page that differs.\n"
    )


def _statuses(kind: Any, meanings: dict[str, str]) -> str:
    rows = []
    for status in get_args(kind):
        if status not in meanings:
            raise ValueError(f"status {status!r} has no line in docgen.notes")
        rows.append([f"`{status}`", meanings[status]])
    return table(["status", "meaning"], rows)


def pipeline_page() -> str:
    """Every field of a pipeline file, its steps and their options."""
    parts = [
        _header("Pipeline reference", "schemas/pipeline.py"),
        "Every field of a pipeline file. What the fields do together, with examples, is in "
        "[Pipelines](../pipelines.md); references (`${{ }}`) are described there too. "
        "Unknown fields are an error (`invalid_input` naming the field). "
        f"A pipeline holds at most {HARD_MAX_STEPS} steps.\n",
    ]
    for model in (
        PipelineSpec,
        Step,
        Budget,
        Validation,
        Wait,
        StepRetry,
        Concurrency,
        Flow,
        Debounce,
        Batch,
        Throttle,
        CachePolicy,
        ResumeFrom,
    ):
        parts.append(model_section(model))
    parts.append(
        "## ReviewDecision\n\nThe argument of the `review` Workflow Update "
        "(`aiworker review`, `temporal workflow update execute --name review`).\n\n"
        + table(["field", "type", "default", "meaning"], model_rows(ReviewDecision))
        + "\n"
    )
    text = "\n".join(parts)
    # ResumeFrom holds step results: their section is on the result page
    for name in ("StepResult", "Usage", "ErrorCause", "PipelineError"):
        anchor = name.lower()
        text = text.replace(f"](#{anchor})", f"](result.md#{anchor})")
    return text


def result_page() -> str:
    """The result of a pipeline, its steps and the statuses."""
    parts = [
        _header("Result reference", "schemas/pipeline.py"),
        "What `aiworker run` prints: the workflow's result for a run that ended `succeeded` "
        "or `partial` (`temporal workflow result` returns it), the details of its failure "
        "for any other. The shape with an example is in [Results](../results.md).\n",
        model_section(PipelineResult),
        model_section(PipelineError),
        model_section(ErrorCause),
        model_section(StepResult),
        model_section(Usage, notes.FIELDS),
        "## Pipeline statuses\n\nThe terminal statuses of a pipeline (`status`, and the "
        "search attribute `AiworkerStatus` once it ended). `succeeded` and `partial` complete "
        "the workflow execution, `cancelled` cancels it, and every other status fails it with "
        "a non-retryable `ApplicationError` whose type is the error code and whose details "
        "carry the result ([how Temporal sees the end of a run]"
        "(../results.md#how-temporal-sees-the-end-of-a-run)).\n\n"
        + _statuses(TerminalStatus, notes.PIPELINE_STATUSES)
        + "\n",
        "## Step statuses\n\n" + _statuses(StepStatus, notes.STATUSES) + "\n",
    ]
    return "\n".join(parts)


def errors_page() -> str:
    """Every stable error code: retryable or not, when, what to do."""
    rows = []
    for c in ErrorCode:
        if c.value not in notes.ERRORS:
            raise ValueError(f"error code {c.value!r} has no line in docgen.notes.ERRORS")
        when, todo = notes.ERRORS[c.value]
        retry = "yes" if RETRYABLE[c] else "no"
        rows.append([f"`{c.value}`", retry, when, todo])
    return "\n".join(
        [
            _header("Error codes", "schemas/errors.py"),
            "Every failure carries one of these codes: the `error_code` of a step, the "
            "`code` of a result's `error`, the `type` of a worker's `ApplicationError`. "
            "Codes are added, never renamed. A retryable code is retried by Temporal under "
            "the worker's retry policy (each attempt is in the history); a non-retryable one "
            "fails the step at once. How failures travel is in [Results](../results.md).\n",
            table(["code", "retryable", "when", "what to do"], rows),
            "",
        ]
    )


def _setting_default(value: Any) -> str:
    if value is None or value == () or value == "":
        return "unset"
    return code(jsonable(value))


def settings_page() -> str:
    """Every ``AIWORKER_*`` setting and every cap with its bounds."""
    rows = []
    for name, field in Settings.model_fields.items():
        if name in notes.DERIVED_SETTINGS:
            continue
        var = ENV_PREFIX + name.upper()
        if name not in notes.SETTINGS:
            raise ValueError(f"setting {var} has no line in docgen.notes.SETTINGS")
        try:
            Settings.from_env({var: ""})
        except SettingsError as e:
            raise ValueError(f"{var} is not a variable Settings.from_env reads: {e}") from None
        rows.append(
            [
                f"`{var}`",
                _setting_default(field.get_default(call_default_factory=True)),
                notes.SETTINGS[name],
            ]
        )
    cap_schema = Caps.model_json_schema()["properties"]
    cap_rows = []
    for name, field in Caps.model_fields.items():
        if name not in notes.CAPS:
            raise ValueError(f"cap {name} has no line in docgen.notes.CAPS")
        bounds = cap_schema[name]
        cap_rows.append(
            [
                f"`{SETTING_OF[name]}`",
                f"{field.default:,}",
                f"{bounds['minimum']:,}{DASH}{bounds['maximum']:,}",
                notes.CAPS[name],
            ]
        )
    return "\n".join(
        [
            _header("Settings", "config/settings.py", "schemas/caps.py"),
            "Every `AIWORKER_*` variable, read once when a process starts and validated "
            "there: an unknown or malformed variable stops the process with its name. The "
            "Temporal connection comes from the SDK's envconfig (`TEMPORAL_ADDRESS`, "
            "`TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, TLS, `temporal.toml` profiles). "
            "Lists are comma-separated.\n",
            table(["variable", "default", "meaning"], rows),
            "",
            "## Caps\n\nBounds on what one pipeline may ask of the engine. Over a cap a "
            "pipeline fails with `invalid_input` (structure) or `payload_too_large` "
            "(resolved size), naming the step and field, before anything runs. The check at "
            "workflow start, inside the workflow task, holds the upper bounds (the ceiling "
            "of each range); the settings apply in `aiworker check`/`run`, "
            "`PipelineClient.start`, and in the workflow before its first step. See "
            "[Limits](../limits.md).\n",
            table(["variable", "default", "allowed", "what it bounds"], cap_rows),
            "",
        ]
    )


def _check_example(spec: WorkerSpec, output: dict[str, Any]) -> None:
    error = safe_schema.first_error(safe_schema.validator(spec.output_schema), output)
    if error is not None:
        raise ValueError(
            f"docgen.notes.WORKERS[{spec.worker_id!r}].output misses its output_schema: "
            f"{error.message}"
        )


def _meanings(n: notes.WorkerNotes, side: str) -> dict[str, str]:
    prefix = side + "."
    return {k.removeprefix(prefix): v for k, v in n.fields.items() if k.startswith(prefix)}


def worker_page(spec: WorkerSpec) -> str:
    """One built-in worker: purpose, limits, input, output, an example, its errors."""
    n = notes.WORKERS.get(spec.worker_id)
    if n is None:
        raise ValueError(f"worker {spec.worker_id!r} has no entry in docgen_notes.WORKERS")
    _check_example(spec, n.output)
    c, r = spec.constraints, spec.retries
    limits = table(
        ["", ""],
        [
            ["task queue", f"`{spec.task_queue}`"],
            ["version", f"`{spec.version}`"],
            ["timeout", f"{c.timeout_seconds:g} s per attempt (a step may only lower it)"],
            [
                "retries",
                f"{r.max_attempts} attempts, {r.backoff} backoff from "
                f"{r.initial_interval_ms} ms to {r.max_interval_ms} ms; non-retryable codes fail "
                "at once",
            ],
            ["tools", ", ".join(f"`{t}`" for t in c.tools_allowed) or "none"],
            [
                "external calls",
                "unlimited" if c.max_external_calls is None else str(c.max_external_calls),
            ],
            ["max tokens", "unlimited" if c.max_tokens is None else str(c.max_tokens)],
            ["rate limit", f"{c.rate_limit} per tenant" if c.rate_limit else "none"],
            ["side effects", "yes" if spec.side_effects else "no"],
            [
                "execution",
                "local activity in the process running the pipeline (`AIWORKER_LOCAL_ACTIVITIES`)"
                if spec.execution == "local"
                else "child workflow"
                if spec.kind == "workflow"
                else "activity",
            ],
        ],
    )
    header = ["field", "type", "required", "default", "meaning"]
    example = spec.examples[0] if spec.examples else None
    parts = [
        _header(f"Worker `{spec.worker_id}`", f"schemas/workers/{spec.worker_id}.json"),
        prose(spec.purpose) + "\n",
        prose(n.note) + "\n" if n.note else "",
        limits + "\n",
        "## Input\n",
        table(header, schema_rows(spec.input_schema, _meanings(n, "input"))) + "\n",
        "## Output\n",
        table(header, schema_rows(spec.output_schema, _meanings(n, "output"))) + "\n",
        "## Example\n",
        (
            f"{example.description[:1].upper()}{example.description[1:]}, as a pipeline step:\n"
            if example and example.description
            else "As a pipeline step:\n"
        ),
        "```json\n"
        + json.dumps(
            {"id": "example", "worker": spec.worker_id, "input": example.input if example else {}},
            indent=2,
        )
        + "\n```\n",
        "Its outputs (`steps.example.outputs`) look like:\n",
        "```json\n" + json.dumps(n.output, indent=2) + "\n```\n",
        "## Errors\n",
        "Besides the runtime's own (`invalid_input` for an input that misses the schema, "
        "`invalid_output`, `timeout`, `internal`; see [error codes](../errors.md)):\n",
        table(["code", "when"], [[f"`{k}`", v] for k, v in n.errors.items()]) + "\n",
        "<details><summary>The input and output JSON Schemas</summary>\n",
        "```json\n"
        + json.dumps(
            {"input_schema": spec.input_schema, "output_schema": spec.output_schema}, indent=2
        )
        + "\n```\n",
        "</details>\n",
    ]
    for code_ in n.errors:
        ErrorCode(code_)
    return "\n".join(p for p in parts if p)


def workers_index(specs: dict[str, WorkerSpec]) -> str:
    rows = [
        [
            f"[`{w}`]({w}.md)",
            f"`{s.task_queue}`",
            f"{s.constraints.timeout_seconds:g} s",
            str(s.retries.max_attempts),
            s.purpose,
        ]
        for w, s in sorted(specs.items())
    ]
    return "\n".join(
        [
            _header("Built-in workers", "schemas/workers/*.json"),
            "`aiworker workers` lists the workers a process knows, yours included. Writing "
            "your own: [Write your own worker](../../workers.md).\n",
            table(["worker", "task queue", "timeout", "attempts", "purpose"], rows),
            "",
        ]
    )


def tenants_page() -> str:
    """The tenant registry file: every field, and the file's bounds."""
    return "\n".join(
        [
            _header("Tenant registry", "schemas/tenants.py"),
            "The file `AIWORKER_TENANTS_FILE` names, read once when a process starts. What "
            "the registry means and what is scoped by tenant: [Tenants](../tenants.md).\n",
            f"Read strictly: no unknown fields, no quoted numbers, at most "
            f"{tenants.MAX_FILE_BYTES // (1024 * 1024)} MiB, {tenants.MAX_TENANTS:,} tenants "
            f"and {tenants.MAX_ENTRIES} entries per list or map. A tenant name matches "
            f"`{TENANT_PATTERN}`.\n",
            model_section(tenants.TenantRegistry, notes.FIELDS),
            model_section(tenants.TenantPolicy, notes.FIELDS),
            model_section(Budget),
        ]
    )


def render_all() -> dict[str, str]:
    """Every generated page by its path under ``docs/``."""
    specs = load_specs()
    pages = {
        f"{REFERENCE}/pipeline.md": pipeline_page(),
        f"{REFERENCE}/result.md": result_page(),
        f"{REFERENCE}/errors.md": errors_page(),
        f"{REFERENCE}/settings.md": settings_page(),
        f"{REFERENCE}/tenants.md": tenants_page(),
        f"{REFERENCE}/workers/README.md": workers_index(specs),
    }
    for worker_id, spec in specs.items():
        pages[f"{REFERENCE}/workers/{worker_id}.md"] = worker_page(spec)
    return pages


def export_docs(folder: Path = DOCS_DIR) -> list[Path]:
    """Write every generated page under ``folder``; returns the paths written."""
    out = []
    for rel, text in render_all().items():
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, "utf-8")
        out.append(p)
    return out


def check_docs(folder: Path = DOCS_DIR) -> list[str]:
    """Generated pages that are missing, differ, or are left over; empty when in sync."""
    drift = []
    pages = render_all()
    for rel, text in pages.items():
        p = folder / rel
        if not p.exists():
            drift.append(f"{p} is missing; run `make docs`")
        elif p.read_text("utf-8") != text:
            drift.append(f"{p} differs from its source; run `make docs`")
    ref = folder / REFERENCE
    if ref.is_dir():
        for p in sorted(ref.rglob("*.md")):
            if p.relative_to(folder).as_posix() not in pages:
                drift.append(f"{p} is generated by nothing; remove it")
    return drift
