"""``aiworker run --field F``: the summary table prints the output field the user
asked for whole (a string as its text, lines kept) and cuts the others; piped
runs of the real CLI against the session's Temporal server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

from conftest import Stack
from support.procs import run_cli_module

from aiworker.workers.cli.common import EXIT_OK, EXIT_USAGE
from aiworker.workers.client.progress import OUTPUT_CHARS

ARTICLE = "\n".join(f"# part {i}\n" + "word " * 40 for i in range(4))  # ~850 chars, lines
NOTE = "n" * 300
PIPELINE = {
    "name": "field-run",
    "inputs": {"article": ARTICLE, "note": NOTE},
    "steps": [{"id": "v", "worker": "validator", "input": {"data": 1, "schema": {}}}],
    "output": {"article": "${{ inputs.article }}", "note": "${{ inputs.note }}", "ok": 1},
}


def run_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = stack.client.service_client.config.target_host
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = stack.settings.task_queue_suffix
    env["AIWORKER_DATA_DIR"] = str(stack.settings.data_dir)
    return run_cli_module(list(args), env, timeout=120)


async def test_run_field_prints_the_asked_field_whole(stack: Stack, tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps(PIPELINE))
    asked, plain = await asyncio.gather(
        asyncio.to_thread(run_cli, stack, "run", str(f), "--field", "article"),
        asyncio.to_thread(run_cli, stack, "run", str(f)),
    )
    assert asked.returncode == EXIT_OK, asked.stderr
    assert plain.returncode == EXIT_OK, plain.stderr
    # the asked field: its text whole, every line of it, after its own label
    assert f"output.article:\n{ARTICLE}\n" in asked.stdout
    # the other long field: cut, saying how to see it whole; a short one whole
    note = next(line for line in asked.stdout.splitlines() if line.startswith("output.note: "))
    assert len(note) < len("output.note: ") + OUTPUT_CHARS + 40
    assert note.endswith("…  (--field note prints it whole)")
    assert "output.ok: 1" in asked.stdout.splitlines()
    # without --field no field is whole: each is cut on a line of its own
    assert ARTICLE not in plain.stdout and json.dumps(ARTICLE)[:100] in plain.stdout
    assert "…  (--field article prints it whole)" in plain.stdout


async def test_run_field_not_in_the_output_is_refused_before_it_starts(
    stack: Stack, tmp_path: Path
) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps(PIPELINE))
    proc = await asyncio.to_thread(run_cli, stack, "run", str(f), "--field", "summary")
    assert proc.returncode == EXIT_USAGE
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        "aiworker: --field 'summary' is not a field of the pipeline's output "
        "(its fields: article, note, ok)"
    )
