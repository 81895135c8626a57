"""``aiworker check FILE|-``: exit 0 and one ``ok`` line for a valid pipeline, exit 2
and one line per problem (or ``--json``) for an invalid one; the settings' part
(model aliases, tenants) too. ``aiworker run`` refuses through the same check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.pipelines import one_step_pipeline

AIWORKER = str(Path(sys.executable).parent / "aiworker")

VALID = one_step_pipeline("ok")

BROKEN = {
    "name": "broken",
    "tenant": "acme",
    "inputs": {"site": "https://shop.example/"},
    "steps": [
        {
            "id": "scrape",
            "worker": "web-scrape",
            "input": {
                "url": "${{ inputs.sitee }}",
                "extraction_spec": {"fields": {"price": {"selectr": ".price"}}},
            },
        },
        {
            "id": "check",
            "worker": "validator",
            "input": {"data": "${{ steps.scrape.outputs.data }}", "schema": {"type": "objekt"}},
        },
    ],
}


def cli(args: list[str], stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    # No Temporal at all: a check never connects.
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    return subprocess.run(
        [AIWORKER, *args],
        input=stdin,
        env={**base, "TEMPORAL_ADDRESS": "127.0.0.1:9", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def write(tmp_path: Path, doc: Any, name: str = "p.json") -> Path:
    f = tmp_path / name
    f.write_text(json.dumps(doc))
    return f


def test_a_valid_pipeline_is_ok_with_exit_0(tmp_path: Path) -> None:
    f = write(tmp_path, VALID)
    proc = cli(["check", str(f)])
    assert (proc.returncode, proc.stdout) == (0, f"ok: {f} (1 step)\n")
    # no Temporal: the local specs, saying so in one line
    assert proc.stderr == (
        "aiworker: checked against local specs (Temporal at 127.0.0.1:9 did not answer: "
        "connection refused)\n"
    )
    proc = cli(["check", "-"], stdin=json.dumps(VALID))
    assert (proc.returncode, proc.stdout) == (0, "ok: - (1 step)\n")


def test_an_invalid_pipeline_prints_one_line_per_problem_with_exit_2(tmp_path: Path) -> None:
    f = write(tmp_path, BROKEN)
    proc = cli(["check", str(f)])
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.splitlines() == [
        f"{f}: step 'scrape': field 'input.extraction_spec.fields.price.selectr': unknown key "
        "(did you mean 'selector'?)",
        f"{f}: step 'scrape': field 'input.url': inputs.sitee: inputs has no 'sitee' "
        "(did you mean 'site'?)",
        f"{f}: step 'check': field 'input.schema': invalid JSON Schema at /type: \"objekt\" is "
        'not one of ["array","boolean","integer","null","number","object","string"]',
    ]
    assert "Traceback" not in proc.stderr


def test_json_lists_step_field_path_message_and_suggestion(tmp_path: Path) -> None:
    proc = cli(["check", "--json", str(write(tmp_path, BROKEN))])
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc[0] == {
        "step": "scrape",
        "field": "input",
        "path": "steps[0].input.extraction_spec.fields.price.selectr",
        "message": "step 'scrape': field 'input.extraction_spec.fields.price.selectr': "
        "unknown key (did you mean 'selector'?)",
        "suggestion": "selector",
    }
    assert [p["path"] for p in doc[1:]] == ["steps[0].input.url", "steps[1].input.schema"]
    ok = cli(["check", "--json", str(write(tmp_path, VALID))])
    assert (ok.returncode, json.loads(ok.stdout)) == (0, [])


def test_an_unknown_model_alias_and_an_unknown_tenant_are_caught(tmp_path: Path) -> None:
    models = write(
        tmp_path, {"models": {"small": {"model": "m"}, "large": {"model": "l"}}}, "m.json"
    )
    tenants = write(tmp_path, {"tenants": {"acme": {"workers": ["validator"]}}}, "t.json")
    ask = {"id": "ask", "worker": "llm-call", "input": {"prompt": "hi", "model": "smal"}}
    pipeline = {"name": "llm", "tenant": "acme-eu", "steps": [ask]}
    env = {"AIWORKER_MODELS_FILE": str(models), "AIWORKER_TENANTS_FILE": str(tenants)}
    f = write(tmp_path, pipeline)
    proc = cli(["check", str(f)], **env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.splitlines() == [
        f"{f}: pipeline: field 'tenant': unknown tenant 'acme-eu' (known: acme) "
        "(did you mean 'acme'?)",
        f"{f}: step 'ask': field 'input.model': unknown model alias 'smal' (known: large, small) "
        "(did you mean 'small'?)",
    ]
    # the tenant exists but may not call llm-call; `default` is no alias here
    del ask["input"]["model"]
    proc = cli(["check", str(write(tmp_path, {**pipeline, "tenant": "acme"}))], **env)
    assert proc.returncode == 2
    assert [line.split(": ", 1)[1] for line in proc.stdout.splitlines()] == [
        "step 'ask': field 'worker': tenant 'acme' may not call worker 'llm-call'",
        "step 'ask': field 'input.model': unknown model alias 'default' (known: large, small)",
    ]
    # a process that configures no model has no alias to check
    ask["input"]["model"] = "smal"
    assert cli(["check", str(write(tmp_path, {**pipeline, "tenant": "default"}))]).returncode == 0


def test_an_agents_tools_are_held_to_the_tenants_worker_list(tmp_path: Path) -> None:
    """A tool is a call of its worker: a tool the tenant may not call is refused as a
    step's worker is (literal, or named by the pipeline's inputs), and so is llm-call,
    each model turn of the agent, for a tenant without it."""
    narrow = {"workers": ["llm-agent", "llm-call", "validator"]}
    tenants = write(tmp_path, {"tenants": {"acme": narrow}}, "t.json")
    agent = {
        "id": "agent",
        "worker": "llm-agent",
        "input": {
            "prompt": "Check it.",
            "tools": ["validator", {"worker": "publish", "max_calls": 1}, "${{ inputs.extra }}"],
        },
    }
    pipeline = {
        "name": "agent",
        "tenant": "acme",
        "inputs": {"extra": "web-scrape"},
        "steps": [agent],
    }
    env = {"AIWORKER_TENANTS_FILE": str(tenants)}
    f = write(tmp_path, pipeline)
    proc = cli(["check", str(f)], **env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        f"{f}: step 'agent': field 'input.tools[1]': tenant 'acme' may not call worker 'publish'",
        f"{f}: step 'agent': field 'input.tools[2]': "
        "tenant 'acme' may not call worker 'web-scrape'",
    ]
    doc = json.loads(cli(["check", "--json", str(f)], **env).stdout)
    assert [p["path"] for p in doc] == ["steps[0].input.tools[1]", "steps[0].input.tools[2]"]
    # within the list it passes; without llm-call the model turns are refused
    agent["input"]["tools"] = ["validator"]
    assert cli(["check", str(write(tmp_path, pipeline))], **env).returncode == 0
    narrow["workers"] = ["llm-agent", "validator"]
    write(tmp_path, {"tenants": {"acme": narrow}}, "t.json")
    proc = cli(["check", str(write(tmp_path, pipeline))], **env)
    assert proc.returncode == 2
    assert [line.split(": ", 1)[1] for line in proc.stdout.splitlines()] == [
        "step 'agent': field 'worker': tenant 'acme' may not call worker 'llm-call' "
        "(each model turn of 'llm-agent' is a call of it)"
    ]


def test_run_refuses_through_the_same_check_and_starts_nothing(tmp_path: Path) -> None:
    f = write(tmp_path, BROKEN)
    proc = cli(["run", str(f)])
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert (
        f"aiworker: {f}: step 'scrape': field 'input.extraction_spec.fields.price.selectr': "
        "unknown key (did you mean 'selector'?)"
    ) in proc.stderr.splitlines()
    assert "cannot reach Temporal" not in proc.stderr


def test_a_file_that_is_no_json_is_one_line_with_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    proc = cli(["check", str(f)])
    assert proc.returncode == 2
    assert (
        proc.stderr
        == f"aiworker: {f}:1:2: not valid JSON: Expecting property name enclosed in double quotes\n"
    )
