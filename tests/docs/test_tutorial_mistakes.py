"""The tutorial's "Break it on purpose" table is what ``aiworker check`` says.

Each row names a change to ``examples/pipelines/scrape.json`` and the line the
check prints for it. The test makes each change (keyed by the row's first
cell), runs the real command, and compares the whole line, so the table cannot
drift from the messages.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aiworker.workers.cli.main import main

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorial.md"
BASE = json.loads((REPO / "examples" / "pipelines" / "scrape.json").read_text())


def _step(d: dict[str, Any], sid: str) -> dict[str, Any]:
    return next(s for s in d["steps"] if s["id"] == sid)


def _fields(d: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = _step(d, "scrape")["input"]["extraction_spec"]["fields"]
    return fields


SUMMARY_ROW = (
    'a step `{"id": "summary", "worker": "llm-call", "input": {"model": "gpt5", "prompt": "..."}}`'
)

# First cell of the row -> the change it describes.
CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {
    '`"url": "${{ inputs.urll }}"` in `scrape`': lambda d: _step(d, "scrape")["input"].update(
        url="${{ inputs.urll }}"
    ),
    '`"title": {"selectr": "h1", "required": true}` in `scrape`': lambda d: _fields(d).update(
        title={"selectr": "h1", "required": True}
    ),
    '`"selector": "h1["` in `fields.title`': lambda d: _fields(d)["title"].update(selector="h1["),
    '`"schema": {"type": "objec"}` in `check`': lambda d: _step(d, "check")["input"].update(
        schema={"type": "objec"}
    ),
    '`"worker": "web-scrap"` in `scrape`': lambda d: _step(d, "scrape").update(worker="web-scrap"),
    '`"gate": "chek"` in `save`': lambda d: _step(d, "save").update(gate="chek"),
    '`"title": "${{ steps.scrape.outputs.data.titel }}"` in `output`': lambda d: d["output"].update(
        title="${{ steps.scrape.outputs.data.titel }}"
    ),
    SUMMARY_ROW: (
        lambda d: d["steps"].append(
            {
                "id": "summary",
                "worker": "llm-call",
                "input": {"model": "gpt5", "prompt": "Summarize the page."},
            }
        )
    ),
}


def _rows() -> list[tuple[str, str]]:
    text = TUTORIAL.read_text()
    table = text[text.index("| change in my-pipeline.json |") :].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        m = re.fullmatch(r"\| (.+) \| `(.+)` \|", line)
        assert m, f"not a table row: {line}"
        rows.append((m.group(1), m.group(2)))
    return rows


def test_every_row_has_a_change() -> None:
    assert [r[0] for r in _rows()] == list(CHANGES)


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r[0][:40])
def test_check_says_what_the_tutorial_says(
    row: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    change, expected = row
    # One configured model, as the row for model aliases assumes ("known: default").
    monkeypatch.setenv("AIWORKER_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("AIWORKER_LLM_MODEL", "small")
    # no Temporal: the local specs, whatever server this machine runs
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:9")
    pipeline = copy.deepcopy(BASE)
    CHANGES[change](pipeline)
    path = tmp_path / "my-pipeline.json"
    path.write_text(json.dumps(pipeline))

    code = main(["check", str(path)])

    out = capsys.readouterr()
    # the tutorial's table shows the problem lines; the line saying which specs
    # `check` used (the local ones here: no Temporal) is told about in its text
    lines = [
        ln
        for ln in (out.out + out.err).splitlines()
        if ln and not ln.startswith("aiworker: checked against local specs (")
    ]
    assert code == 2
    assert lines == [f"{path}: {expected}"]
