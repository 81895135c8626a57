"""The core alone: the wheel installed without extras in a fresh venv.

Builds the wheel from the worktree (offline, ``--no-deps``), installs it into a
new venv (pip resolves the core's dependencies from its cache), and checks from
processes of that venv that the core's import paths load none of the extras'
modules and that serving a worker whose extra is missing names the extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

ROOT = Path(__file__).resolve().parents[2]
EXTRA_MODULES = (
    "bs4", "lxml", "trafilatura", "playwright", "fastapi", "uvicorn",
    "aioboto3", "botocore", "protego", "brotli", "soupsieve", "charset_normalizer",
)  # fmt: skip

CHECK = f"""
import sys
import aiworker.workers.cli, aiworker.workers.client, aiworker.workers.worker
import aiworker.workflows.pipeline, aiworker.workers.registry
from aiworker.schemas.settings import Settings
from aiworker.workers.plugins import load_workers
ws = load_workers(Settings())
ws.served["validator"], ws.served["aggregator"], ws.served["publish"], ws.served["llm-call"]
print(sorted(m for m in sys.modules if m.split(".")[0] in {EXTRA_MODULES!r}))
"""


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("core")
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(ROOT)],
        check=True,
    )  # fmt: skip
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (wheel,) = wheels.glob("aiworker-*.whl")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True)
    return venv


def _env(address: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "PYTHON"))}
    env.update(
        TEMPORAL_ADDRESS=address,
        AIWORKER_DATA_DIR=str(tmp),
        AIWORKER_METRICS_PORT="0",
        AIWORKER_REGISTRY_TTL_SECONDS="0",
    )
    return env


@pytest.mark.slow
def test_core_install_imports_no_extra(core_venv: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [str(core_venv / "bin" / "python"), "-c", CHECK],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
    # the extras are not even installed: nothing could have loaded them
    missing = subprocess.run(
        [str(core_venv / "bin" / "python"), "-c", "import bs4"], capture_output=True, cwd=tmp_path
    )
    assert missing.returncode != 0


@pytest.mark.slow
async def test_core_install_names_missing_extra(
    core_venv: Path, env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = env.client.service_client.config.target_host
    scrape = subprocess.run(
        [str(core_venv / "bin" / "aiworker"), "worker", "--task-queue", "aiworker-scrape",
         "--address", address],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env(address, tmp_path),
    )  # fmt: skip
    assert scrape.returncode == 2, scrape.stderr
    assert "web-scrape needs the 'scrape' extra: pip install 'aiworker[scrape]'" in scrape.stderr
    serve = subprocess.run(
        [str(core_venv / "bin" / "aiworker"), "serve"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=_env(address, tmp_path),
    )  # fmt: skip
    assert serve.returncode == 2, serve.stderr
    assert "aiworker serve needs the 'serve' extra: pip install 'aiworker[serve]'" in serve.stderr
