"""``aiworker check --quote FILE [--json]`` as a real CLI process: the same exit 2
as ``check`` for a missing or invalid file; a valid pipeline's quote names the
steps it could not estimate."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli_check import cli, write

QUOTED = {
    "name": "quoted",
    "steps": [
        {
            "id": "v",
            "worker": "validator",
            "for_each": [1, 2, 3],
            "input": {"data": "${{ item }}", "schema": {}},
        }
    ],
}


def test_quote_json_lists_the_steps_without_history(tmp_path: Path) -> None:
    r = cli(["check", "--quote", "--local", "--json", str(write(tmp_path, QUOTED))])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    for key in ("tokens", "external_calls", "cost_usd", "duration_s"):
        assert set(doc[key]) == {"p50", "p95"}
    assert [u["step"] for u in doc["unknown"]] == ["v"]


def test_quote_text_and_bad_input(tmp_path: Path) -> None:
    r = cli(["check", "--quote", "--local", str(write(tmp_path, QUOTED))])
    assert r.returncode == 0 and "quote for pipeline quoted" in r.stdout, r.stderr
    missing = cli(["check", "--quote", "--local", str(tmp_path / "none.json")])
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    bad = {"name": "bad", "steps": [{"id": "v", "worker": "no-such-worker"}]}
    invalid = cli(["check", "--quote", "--local", str(write(tmp_path, bad, "bad.json"))])
    assert invalid.returncode == 2 and "no-such-worker" in invalid.stderr
    assert invalid.stdout == ""
