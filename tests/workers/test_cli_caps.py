"""``aiworker run`` checks a pipeline file against the caps of its settings
(``AIWORKER_MAX_*``) and refuses JSON too deep to read, before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

AIWORKER = str(Path(sys.executable).parent / "aiworker")


def run(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # No Temporal address is needed: the file is refused before any connection.
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    return subprocess.run(
        [AIWORKER, "run", str(path)],
        env={**base, "TEMPORAL_ADDRESS": "127.0.0.1:9", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_refuses_json_nested_too_deep_to_read(tmp_path: Path) -> None:
    f = tmp_path / "deep.json"
    f.write_text('{"name": "p", "inputs": {"d": ' + "[" * 5000 + "]" * 5000 + "}}")
    proc = run(f)
    assert proc.returncode == 2, proc.stderr
    assert "invalid pipeline (invalid_input): JSON nested too deep to read" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_checks_the_caps_its_settings_set(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    step = {"id": "each", "worker": "validator", "for_each": [1, 2, 3], "input": {"data": 1}}
    f.write_text(json.dumps({"name": "p", "steps": [step]}))
    proc = run(f, AIWORKER_MAX_FOREACH_ITEMS="2")
    assert proc.returncode == 2, proc.stderr
    assert (
        "step 'each': field 'for_each': 3 items; the cap is 2 (AIWORKER_MAX_FOREACH_ITEMS)"
        in proc.stderr
    )
    proc = run(f, AIWORKER_MAX_FOREACH_ITEMS="0")
    assert proc.returncode == 2
    assert "AIWORKER_MAX_FOREACH_ITEMS" in proc.stderr
