"""The core alone: the wheel installed without extras in a fresh venv.

Builds the wheel from the worktree (offline, ``--no-deps``), installs it into a
new venv (pip resolves the core's dependencies from its cache), and checks from
processes of that venv that the core's import paths load none of the extras'
modules and that serving a worker whose extra is missing names the extra.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.waiting import wait_until
from temporalio.testing import WorkflowEnvironment

from aiworker.config.settings import Settings
from aiworker.workers.client.client import PipelineClient

ROOT = Path(__file__).resolve().parents[2]
EXTRA_MODULES = (
    "bs4", "lxml", "trafilatura", "playwright", "fastapi", "uvicorn",
    "aioboto3", "botocore", "protego", "brotli", "soupsieve", "charset_normalizer",
)  # fmt: skip

CHECK = f"""
import sys
import aiworker.workers.cli.main, aiworker.workers.client.client, aiworker.workers.process.worker
import aiworker.workflows.pipeline, aiworker.workers.process.task_queues
from aiworker.config.settings import Settings
from aiworker.workers.process.worker_set import load_workers
ws = load_workers(Settings())
ws.served["validator"], ws.served["aggregator"], ws.served["publish"], ws.served["llm-call"]
print(sorted(m for m in sys.modules if m.split(".")[0] in {EXTRA_MODULES!r}))
"""


# `aiworker worker` run from the core venv (the console script's main), writing
# which extras' modules it had imported when it exits (after serving a pipeline)
SERVE = f"""
import sys
from pathlib import Path
out = Path(sys.argv.pop(1))
sys.argv[0] = "aiworker"
from aiworker.workers.cli.main import main
from aiworker.workers.cli.errors import exit_process
try:
    code = main()
finally:  # the console script ends in os._exit: report before it
    out.write_text(repr(sorted(m for m in sys.modules if m.split(".")[0] in {EXTRA_MODULES!r})))
exit_process(code)
"""


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("core")
    # Built from a copy without the worktree's own build output: setuptools
    # reuses ./build/, which can still hold modules that no longer exist.
    source = work / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".aiworker",
        ".hypothesis", "node_modules",
    ))  # fmt: skip
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(source)],
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
    # the wheel ships its type hints (PEP 561) and its licence
    shipped = subprocess.run(
        [str(core_venv / "bin" / "python"), "-c",
         "import aiworker, importlib.metadata as md, pathlib;"
         "files = md.files('aiworker');"
         "print(pathlib.Path(aiworker.__file__).with_name('py.typed').is_file(),"
         " any(f.name == 'LICENSE' for f in files),"
         " any('docgen' in str(f) for f in files),"
         " any(str(f).startswith('aiworker/config/') for f in files))"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    # ... with its configuration package, and without the docs generator
    assert shipped.stdout.split() == ["True", "True", "False", "True"], shipped.stderr


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


@pytest.mark.slow
async def test_core_worker_runs_a_validator_pipeline_started_from_another_venv(
    core_venv: Path, env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The core's worker process serves a validator pipeline that this (full)
    venv starts through the SDK client, and never imports an extra's module."""
    address = env.client.service_client.config.target_host
    suffix = f"core{os.getpid()}{tmp_path.name[-6:]}".replace("_", "")
    report = tmp_path / "modules.txt"
    proc_env = _env(address, tmp_path) | {"AIWORKER_TASK_QUEUE_SUFFIX": suffix}
    worker = subprocess.Popen(
        [str(core_venv / "bin" / "python"), "-c", SERVE, str(report),
         "worker", "--task-queue", "aiworker-pipelines", "--address", address],
        cwd=tmp_path, env=proc_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        settings = Settings(task_queue_suffix=suffix, data_dir=tmp_path / "client")
        pipelines = await PipelineClient.connect(settings=settings, target_host=address)
        handle = await pipelines.start(
            {
                "name": "core-only",
                "steps": [
                    {
                        "id": "check",
                        "worker": "validator",
                        "input": {
                            "data": {"sku": "A-1", "price": 3},
                            "schema": {
                                "type": "object",
                                "required": ["sku", "price"],
                                "properties": {"price": {"type": "number", "minimum": 0}},
                            },
                        },
                    }
                ],
            }
        )
        result = await handle.result()
        assert result.status == "succeeded", result
        assert result.steps["check"].outputs["valid"] is True
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            _, err = worker.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    await wait_until(report.exists, f"the core worker's module report ({err[-2000:]!r})", timeout=5)
    assert ast.literal_eval(report.read_text()) == []
