"""The stack finds itself: commands run beside ``aiworker dev`` use its server,
namespace and UI with no ``TEMPORAL_*`` setting, say so on stderr, and a
setting of the user's own always wins; a stale record is ignored, saying why.

A real ``aiworker dev`` (no local model) runs in a fresh folder on free
loopback ports; commands run as a user types them, from that folder or with
the profile file it wrote. Every process is stopped by its recorded PID.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from support.procs import WorkerProcess
from support.waiting import wait_until

from aiworker.workers.devstack.devserver import free_port

AIWORKER = str(Path(sys.executable).parent / "aiworker")
REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "examples" / "pipelines" / "hello.json"


def _env(**extra: str) -> dict[str, str]:
    """The environment of a new user: no Temporal or aiworker settings at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env.update(AIWORKER_LOG_LEVEL="WARNING", **extra)
    return env


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AIWORKER, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
    )


@dataclass
class Dev:
    proc: WorkerProcess
    folder: Path
    port: int
    ui_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest_asyncio.fixture
async def dev(tmp_path: Path) -> AsyncIterator[Dev]:
    """``aiworker dev --site 0`` (no model) in ``tmp_path/project``, until the test ends."""
    folder = tmp_path / "project"
    folder.mkdir()
    port, ui_port = free_port(), free_port()
    cmd = [AIWORKER, "dev", "--no-model", "--port", str(port), "--ui-port", str(ui_port)]
    # a server chosen in dev's own shell: the banner warns that it wins there
    env = _env(
        AIWORKER_METRICS_PORT="0",
        AIWORKER_SHUTDOWN_GRACE_SECONDS="2",
        TEMPORAL_ADDRESS="127.0.0.1:9",
    )
    proc = WorkerProcess([*cmd, "--site", "0"], env, tmp_path / "dev.out", cwd=folder)
    try:
        await wait_until(
            lambda: "Press Ctrl-C" in proc.output() or proc.proc.poll() is not None,
            lambda: f"the dev stack to start: {proc.output()}",
            timeout=90,
            interval=0.5,
        )
        assert proc.proc.poll() is None, proc.output()
        yield Dev(proc, folder, port, ui_port)
    finally:
        proc.terminate()
        proc.close()


@pytest.mark.timeout(180)
async def test_commands_in_the_folder_use_the_dev_stack_and_its_ui(
    dev: Dev, tmp_path: Path
) -> None:
    banner = dev.proc.output()
    profile = dev.folder / ".aiworker" / "temporal.toml"
    # the banner says what a second terminal needs
    assert "Other terminals: aiworker commands and scripts run in this folder use this stack" in (
        banner
    ), banner
    assert f"export TEMPORAL_CONFIG_FILE={profile}" in banner, banner
    assert (
        "Note:            TEMPORAL_ADDRESS=127.0.0.1:9 is set in this shell; commands run "
        "with it use what it names, not this stack"
    ) in banner, banner
    state = json.loads((dev.folder / ".aiworker" / "dev.json").read_text())
    assert state["address"] == dev.address and state["pid"] == dev.proc.pid
    assert state["ui_url"] == f"http://127.0.0.1:{dev.ui_port}"

    # `run` from the folder, told nothing: the dev stack, its UI link, one line on stderr
    ran = await asyncio.to_thread(_cli, ["run", str(HELLO)], dev.folder, _env())
    assert ran.returncode == 0, ran.stderr
    first = ran.stdout.splitlines()[0]
    assert re.fullmatch(
        rf"hello: started (hello-\w+)  http://127\.0\.0\.1:{dev.ui_port}/namespaces/default/"
        r"workflows/hello-\w+",
        first,
    ), ran.stdout
    assert ran.stderr.splitlines() == [
        f"aiworker: using the aiworker dev stack at {dev.address} (from ./.aiworker/dev.json; "
        "TEMPORAL_ADDRESS or --address choose another server)"
    ], ran.stderr

    # --json: stdout is the result alone (the notice stays on stderr)
    as_json = await asyncio.to_thread(_cli, ["run", str(HELLO), "--json"], dev.folder, _env())
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["status"] == "succeeded"
    assert "using the aiworker dev stack" in as_json.stderr

    # elsewhere, the profile file the banner names: the same server and the UI link
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    told = _env(TEMPORAL_CONFIG_FILE=str(profile))
    listed = await asyncio.to_thread(_cli, ["list", "--json"], elsewhere, told)
    assert listed.returncode == 0, listed.stderr
    ids = {row["workflow_id"] for row in json.loads(listed.stdout)}
    assert first.split()[2] in ids, listed.stdout
    again = await asyncio.to_thread(_cli, ["run", str(HELLO)], elsewhere, told)
    assert again.returncode == 0, again.stderr
    assert f"http://127.0.0.1:{dev.ui_port}/namespaces/default/workflows/" in again.stdout

    # a setting of the user's own wins: TEMPORAL_ADDRESS names a server that is not there
    dead = f"127.0.0.1:{free_port()}"
    own = await asyncio.to_thread(_cli, ["list"], dev.folder, _env(TEMPORAL_ADDRESS=dead))
    assert own.returncode == 1, own.stderr
    assert "using the aiworker dev stack" not in own.stderr
    assert "cannot reach Temporal" in own.stderr and dead in own.stderr, own.stderr
    flag = await asyncio.to_thread(_cli, ["list", "--address", dead], dev.folder, _env())
    assert flag.returncode == 1 and "using the aiworker dev stack" not in flag.stderr

    # a second stack on the same port: told to choose another, which its folder finds
    second = tmp_path / "second"
    second.mkdir()
    busy = await asyncio.to_thread(
        _cli, ["dev", "--no-model", "--port", str(dev.port), "--headless"], second, _env()
    )
    assert busy.returncode == 2, busy.stderr
    assert busy.stderr.strip() == (
        f"aiworker: port {dev.port} on 127.0.0.1 (Temporal frontend) is in use; free it or "
        "choose another with --port / --ui-port (commands run in this folder find the stack "
        "on any port)"
    ), busy.stderr
    assert not (second / ".aiworker" / "dev.json").exists()

    # the sample site `dev --site` serves, at the address it printed
    site = re.search(r"Sample site:\s+(http://127\.0\.0\.1:\d+)/", banner)
    assert site, banner
    assert state["site_url"] == site.group(1)
    with urllib.request.urlopen(f"{site.group(1)}/kettle.html", timeout=10) as page:
        assert page.status == 200 and b"<h1" in page.read()

    # a clean stop removes the state; the profile file stays
    dev.proc.proc.send_signal(signal.SIGINT)
    assert await asyncio.to_thread(dev.proc.proc.wait, 60) == 0, dev.proc.output()
    assert not (dev.folder / ".aiworker" / "dev.json").exists()
    assert profile.exists()


async def test_a_stale_dev_state_is_ignored_saying_why(tmp_path: Path) -> None:
    # the record of a dev stack killed with SIGKILL: its process is gone
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    data = tmp_path / ".aiworker"
    data.mkdir()
    record = {"address": f"127.0.0.1:{free_port()}", "namespace": "default", "pid": gone.pid}
    (data / "dev.json").write_text(json.dumps({**record, "ui_url": None, "server_pid": None}))
    checked = await asyncio.to_thread(_cli, ["check", str(HELLO)], tmp_path, _env())
    assert checked.returncode == 0, checked.stderr
    assert (
        f"aiworker: ignoring the dev stack recorded in ./.aiworker/dev.json: its aiworker dev "
        f"(pid {gone.pid}) is no longer running; connecting to localhost:7233"
    ) in checked.stderr.splitlines(), checked.stderr
    assert "using the aiworker dev stack" not in checked.stderr


@pytest.mark.timeout(180)
async def test_the_dev_stack_signs_its_registry_and_commands_beside_it_verify_it(
    dev: Dev, tmp_path: Path
) -> None:
    # a secret of its own, readable by its owner only, with no setting
    secret = dev.folder / ".aiworker" / "registry.secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert len(secret.read_text().strip()) >= 32
    seen: list[subprocess.CompletedProcess[str]] = []

    async def live() -> bool:
        seen.append(await asyncio.to_thread(_cli, ["workers"], dev.folder, _env()))
        return "workers from the live registry (1 process)" in seen[-1].stderr

    # the stack's worker publishes once it polls: the folder's commands verify it
    await wait_until(live, lambda: f"the dev stack's entry, verified: {seen[-1].stderr}")
    assert seen[-1].returncode == 0 and "warning" not in seen[-1].stderr, seen[-1].stderr

    # elsewhere, with the profile but not the secret: local specs, saying why
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    told = _env(TEMPORAL_CONFIG_FILE=str(dev.folder / ".aiworker" / "temporal.toml"))
    local = await asyncio.to_thread(_cli, ["workers"], elsewhere, told)
    assert local.returncode == 0, local.stderr
    assert "workers from local specs (AIWORKER_REGISTRY_SECRET is not set" in local.stderr
    # ...and with it, the live registry
    told["AIWORKER_REGISTRY_SECRET"] = secret.read_text().strip()
    keyed = await asyncio.to_thread(_cli, ["workers"], elsewhere, told)
    assert "workers from the live registry (1 process)" in keyed.stderr, keyed.stderr


def _scrape(url: str) -> dict[str, object]:
    title = {"title": {"selector": "h1", "required": True}}
    return {
        "name": "rollout-scrape",
        "steps": [
            {
                "id": "page",
                "worker": "web-scrape",
                "input": {"url": url, "extraction_spec": {"fields": title}},
            }
        ],
        "output": {"title": "${{ steps.page.outputs.data.title }}"},
    }


@pytest.mark.timeout(300)
async def test_a_worker_started_beside_the_dev_stack_takes_its_dev_settings(
    dev: Dev, tmp_path: Path
) -> None:
    from temporalio.client import Client

    from aiworker.workers.devstack.supervisor import join_dev_stack

    state = json.loads((dev.folder / ".aiworker" / "dev.json").read_text())
    assert state["worker_env"] == {"AIWORKER_ALLOW_PRIVATE_NETWORKS": "true"}, state
    # the rollout of the docs, beside the stack: a new build, made current
    v2 = WorkerProcess(
        [AIWORKER, "worker"],
        _env(
            AIWORKER_BUILD_ID="v2", AIWORKER_METRICS_PORT="0", AIWORKER_SHUTDOWN_GRACE_SECONDS="2"
        ),
        tmp_path / "v2.out",
        cwd=dev.folder,
    )
    try:
        seen: list[subprocess.CompletedProcess[str]] = []

        async def polls() -> bool:
            seen.append(
                await asyncio.to_thread(_cli, ["deployment", "versions"], dev.folder, _env())
            )
            return "v2" in seen[-1].stdout

        # a new build's first poll can wait out a long poll while its version registers
        # (support.processes.READY_SECONDS says when): CI saw v2 unlisted after 20 s
        await wait_until(
            polls,
            lambda: f"build v2 to poll: {seen[-1].stdout} {v2.output()}",
            timeout=120,
            interval=1.0,
        )
        joined = [
            line for line in v2.output().splitlines() if "joins the aiworker dev stack" in line
        ]
        assert joined == [
            f"aiworker: this worker joins the aiworker dev stack at {dev.address} (from "
            "./.aiworker/dev.json) and takes its dev settings: "
            "AIWORKER_ALLOW_PRIVATE_NETWORKS=true (set a variable to choose otherwise)"
        ], v2.output()
        current = await asyncio.to_thread(
            _cli, ["deployment", "set-current", "v2"], dev.folder, _env()
        )
        assert current.returncode == 0, current.stderr

        # a page on loopback (the stack's sample site), scraped by build v2
        pipeline = tmp_path / "scrape.json"
        pipeline.write_text(json.dumps(_scrape(f"{state['site_url']}/kettle.html")))
        ran = await asyncio.to_thread(_cli, ["run", str(pipeline), "--json"], dev.folder, _env())
        result = json.loads(ran.stdout)
        assert ran.returncode == 0 and result["status"] == "succeeded", ran.stdout + ran.stderr
        assert result["output"]["title"], result
        temporal = await Client.connect(dev.address)
        described = await temporal.get_workflow_handle(result["workflow_id"]).describe()
        info = described.raw_description.workflow_execution_info.versioning_info
        assert info.deployment_version.build_id == "v2", info
    finally:
        v2.terminate()
        v2.close()

    # a variable of the worker's own wins, and another server takes nothing
    data = str(dev.folder / ".aiworker")
    own = {"AIWORKER_DATA_DIR": data, "AIWORKER_ALLOW_PRIVATE_NETWORKS": "false"}
    assert join_dev_stack(own) == (own, None)
    elsewhere = {"AIWORKER_DATA_DIR": data}
    assert join_dev_stack(elsewhere, address=f"127.0.0.1:{free_port()}") == (elsewhere, None)
