"""``aiworker check`` as a user meets it, in a real process: a typo in a reference
into a built-in step's outputs is caught with the nearest name, every error of an
invalid JSON Schema is listed at once, the bundled pipelines all pass, a misspelled
setting gets the nearest name, and a misnamed spec file says the naming rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_cli_check import cli, write

ROOT = Path(__file__).resolve().parents[2]
ARTICLE = json.loads((ROOT / "examples/pipelines/article.json").read_text())


def test_a_typo_into_web_scrapes_content_is_caught_with_the_nearest_name(
    tmp_path: Path,
) -> None:
    typo = json.loads(json.dumps(ARTICLE).replace("content.markdown", "contnet.markdown"))
    f = write(tmp_path, typo)
    proc = cli(["check", str(f)])
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.splitlines() == [
        f"{f}: step 'summarize': field 'input.prompt': "
        "steps.read.outputs.data.contnet.markdown: the data of web-scrape step 'read' has no "
        "outputs.data.contnet (it has: content) (did you mean 'content'?)"
    ]
    doc = json.loads(cli(["check", "--json", str(f)]).stdout)
    assert [(p["path"], p["suggestion"]) for p in doc] == [("steps[1].input.prompt", "content")]


def test_every_error_of_a_json_schema_is_listed_at_once(tmp_path: Path) -> None:
    schema = {"type": "objec", "properties": {"n": {"minimum": "zero"}}}
    pipeline = {
        "name": "schemas",
        "steps": [
            {
                "id": "check",
                "worker": "validator",
                "input": {"data": {"n": 1}, "schema": schema},
                "validate": {"schema": schema},
            }
        ],
    }
    proc = cli(["check", str(f := write(tmp_path, pipeline))])
    assert proc.returncode == 2, proc.stderr
    type_error = (
        'invalid JSON Schema at /type: "objec" is not one of '
        '["array","boolean","integer","null","number","object","string"]'
    )
    minimum = 'invalid JSON Schema at /properties/n/minimum: "zero" is not of type number'
    assert proc.stdout.splitlines() == [
        f"{f}: step 'check': field 'validate.schema': {type_error}",
        f"{f}: step 'check': field 'validate.schema': {minimum}",
        f"{f}: step 'check': field 'input.schema': {type_error}",
        f"{f}: step 'check': field 'input.schema': {minimum}",
    ]


BUNDLED = sorted(
    [*(ROOT / "examples/pipelines").glob("*.json"), *(ROOT / "workers/samples").glob("*.json")]
)


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.name)
def test_the_bundled_pipelines_pass_check(path: Path) -> None:
    env = {"AIWORKER_WORKER_SPECS": str(ROOT / "examples/prompts")}
    proc = cli(["check", str(path)], **env)
    if path.name == "typo.json":  # the tutorial's mistake on purpose, and only that
        assert proc.returncode == 2
        assert proc.stdout.splitlines() == [
            f"{path}: step 'check': field 'input.data': inputs.prodcut: inputs has no "
            "'prodcut' (did you mean 'product'?)"
        ]
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"ok: {path} ")


def test_a_misspelled_setting_gets_the_nearest_name(tmp_path: Path) -> None:
    f = write(tmp_path, ARTICLE)
    proc = cli(["check", str(f)], AIWORKER_WORKER_SPEC=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == (
        "aiworker: invalid settings: AIWORKER_WORKER_SPEC: unknown setting "
        "(did you mean 'AIWORKER_WORKER_SPECS'?)\n"
    )
    # nothing close: every setting, and where they are described
    proc = cli(["check", str(f)], AIWORKER_ZZZ="1")
    assert "AIWORKER_ZZZ: unknown setting (known: AIWORKER_" in proc.stderr
    assert proc.stderr.rstrip().endswith("; see docs/configuration.md)")


def test_a_spec_file_not_named_after_its_worker_says_the_rule(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "examples/prompts/classify-ticket.json", specs / "classify.json")
    proc = cli(["check", str(write(tmp_path, ARTICLE))], AIWORKER_WORKER_SPECS=str(specs))
    assert proc.returncode == 2
    assert proc.stderr == (
        f"aiworker: worker spec {specs / 'classify.json'} declares worker_id "
        "'classify-ticket': a spec file is named <worker_id>.json, so rename it "
        "classify-ticket.json (or change its worker_id) (AIWORKER_WORKER_SPECS)\n"
    )
