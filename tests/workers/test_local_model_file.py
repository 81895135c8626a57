"""``AIWORKER_LOCAL_MODEL_FILE``: the dev stack's local model from a GGUF file
already on disk. A real ``llama-server`` serves the demo from the bundled
SmolLM2 file at another path (a symlink with a name of its own); a path that
is no GGUF file is refused with one line and exit 2 before anything starts.
Every process is stopped by its PID."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiworker.workers.devstack.devserver import free_port
from aiworker.workers.devstack.modelserver import (
    MODEL_NAME,
    ModelServerError,
    gguf_file,
    model_file,
    model_name,
)

AIWORKER = str(Path(sys.executable).parent / "aiworker")
SETTING = "AIWORKER_LOCAL_MODEL_FILE"


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env.update(AIWORKER_METRICS_PORT="0", AIWORKER_DATA_DIR=str(tmp), **extra)
    return env


def test_a_gguf_file_is_taken_and_anything_else_refused(tmp_path: Path) -> None:
    link = tmp_path / "My-Model.Q4.gguf"
    link.symlink_to(model_file())
    assert gguf_file(link) == link
    assert model_name(link) == "My-Model.Q4" and model_name(None) == MODEL_NAME
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GG")
    for path, says in (
        (text, "not a GGUF model file"),
        (short, "not a GGUF model file"),
        (tmp_path / "missing.gguf", "no such file"),
        (tmp_path, "cannot read it"),
    ):
        with pytest.raises(ModelServerError) as e:
            gguf_file(path)
        assert str(e.value).startswith(f"invalid settings: {SETTING}={path}: {says}"), e.value
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["not-gguf", "missing"])
async def test_dev_refuses_a_file_that_is_no_gguf_before_anything_starts(
    tmp_path: Path, kind: str
) -> None:
    bad = tmp_path / "model.gguf"
    if kind == "not-gguf":
        bad.write_bytes(b"PK\x03\x04 a zip file, not a model" * 8)
    port = free_port()
    proc = await asyncio.to_thread(
        subprocess.run,
        [AIWORKER, "dev", "--headless", "--port", str(port)],
        env=_env(tmp_path / "data", **{SETTING: str(bad)}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"aiworker: invalid settings: {SETTING}={bad}: "), line
    assert ("not a GGUF model file" if kind == "not-gguf" else "no such file") in line
    assert "Temporal server:" not in proc.stdout and "Local model:" not in proc.stdout
    assert not (tmp_path / "data" / "model-server.log").exists()


@pytest.mark.timeout(300)
async def test_demo_runs_its_summary_on_a_gguf_file_from_the_setting(tmp_path: Path) -> None:
    link = tmp_path / "models" / "my-small-model.gguf"
    link.parent.mkdir()
    link.symlink_to(model_file())
    data = tmp_path / "data"
    proc = await asyncio.to_thread(
        subprocess.run,
        [AIWORKER, "demo", "--exit", "--headless", "--port", str(free_port())],
        env=_env(data, **{SETTING: str(link)}),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout.splitlines()
    (banner,) = [line for line in out if line.startswith("Local model:")]
    assert "(default alias my-small-model; llama-server pid " in banner, banner
    # the server loaded the file from the path the setting names
    log = (data / "model-server.log").read_text("utf-8", "replace")
    assert str(link) in log
    (row,) = [line.split()[:4] for line in out if line.split()[:1] == ["summary"]]
    assert row == ["summary", "llm-call", "succeeded", "1"], proc.stdout
