"""``aiworker run`` on a terminal: a pseudo-terminal for its stdout shows one
progress line redrawn in place, then the summary table; exit codes as before.
(The piped run's plain lines: ``test_cli_reruns``; the renderers:
``test_progress``.)"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack, running_stack
from support.standins import standin
from temporalio.client import Client

from aiworker.config.settings import Settings

AIWORKER = str(Path(sys.executable).parent / "aiworker")


def cli_env(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = stack.client.service_client.config.target_host
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = stack.settings.task_queue_suffix
    env["AIWORKER_UI_URL"] = "http://ui.test:8233"
    env["COLUMNS"] = "150"
    return env


def run_on_terminal(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run ``aiworker ARGS`` with a pseudo-terminal as its stdout; its exit code and
    what it wrote there. Bounded: killed by its PID after ``timeout`` seconds."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [AIWORKER, *args], stdout=slave, stderr=subprocess.PIPE, env=env, close_fds=True
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the process closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
        code = proc.wait(10)
    finally:
        os.close(master)
        if proc.stderr is not None:
            proc.stderr.close()
    return code, out.decode("utf-8", "replace")


@pytest.mark.timeout(120)
async def test_run_on_a_terminal_redraws_one_progress_line(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    async def slow(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(2.5)
        return {"published": True}

    pipeline = {
        "name": "on-tty",
        "steps": [
            {"id": "check", "worker": "validator", "input": {"data": 1, "schema": {}}},
            {
                "id": "save",
                "worker": "publish",
                "depends_on": ["check"],
                "input": {"sink": {"file": "x.jsonl"}, "record": {}},
            },
        ],
    }
    f = tmp_path / "p.json"
    f.write_text(json.dumps(pipeline))
    async with running_stack(
        client, settings, replace_activities={"publish": standin("publish", slow)}
    ) as stack:
        code, screen = await asyncio.to_thread(run_on_terminal, ["run", str(f)], cli_env(stack))
    assert code == 0, screen
    head, _, rest = screen.partition("\n")
    assert re.fullmatch(
        r"on-tty: started on-tty-\w+  http://ui\.test:8233/namespaces/default/workflows/on-tty-\w+\r?",
        head,
    ), head
    # the live line: carriage return, the line, erase to its end; drawn many times
    frames = re.findall(r"\r([^\r\n\x1b]*)\x1b\[K", rest)
    assert len(frames) >= 10, rest
    assert re.fullmatch(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] on-tty  1/2 steps · running: save · \d+\.\ds", frames[-2]), (
        frames
    )
    assert "1/2 steps · running: save" in " ".join(frames)
    # cleared at the end, then the summary table
    table = rest.rsplit("\x1b[K", 1)[1].replace("\r\n", "\n")
    lines = table.strip("\n").splitlines()
    assert re.fullmatch(r"on-tty succeeded in \d+\.\ds", lines[0]), table
    assert re.fullmatch(r"  step   worker     status     attempts  duration", lines[1]), table
    assert re.fullmatch(r"  check  validator  succeeded         1     \d+\.\d\ds", lines[2]), table
    assert re.fullmatch(r"  save   publish    succeeded         1     [2-9]\.\d\ds", lines[3]), (
        table
    )
    assert lines[-1].startswith("workflow: on-tty-"), table
