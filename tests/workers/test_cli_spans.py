"""Every client-side CLI command is a span with its exit code, received by a real
OTLP receiver (rotel on loopback) from the real ``aiworker`` process."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from support.pipelines import one_step_pipeline
from support.rotel import Block, running_rotel
from support.waiting import wait_until
from temporalio.testing import WorkflowEnvironment

from aiworker.workers.cli.command_span import PROCESS_COMMANDS, span_name
from aiworker.workers.cli.parser import build_parser


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[str]:
    """Every command the parser knows, as "schedule list" (subcommands walked)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {" ".join(prefix)}
    out: set[str] = set()
    for name, sub in subs[0].choices.items():
        out |= command_paths(sub, (*prefix, name))
    return out


# One quick invocation of each command: some succeed, some fail on purpose (an id
# that names nothing, a missing file); either way the command must be one span.
def invocations(tmp: Path) -> dict[str, list[str]]:
    pipeline = tmp / "p.json"
    pipeline.write_text(json.dumps(one_step_pipeline()))
    missing = str(tmp / "missing.json")
    return {
        "run": ["run", missing],
        "check": ["check", "--local", str(pipeline)],
        "review": ["review", "no-such-run", "approve"],
        "list": ["list", "--limit", "1"],
        "redrive": ["redrive", "no-such-run"],
        "workers": ["workers"],
        "artifacts": ["artifacts", "no-such-run"],
        "items": ["items", "no-such-run", "step"],
        "replay": ["replay", missing],
        "schemas": ["schemas", "check"],
        "conformance": ["conformance", "no-such-worker"],
        "keys add": ["keys", "add", "ci", "--tenant", "acme", "--file", str(tmp / "keys.json")],
        "schedule create": ["schedule", "create", missing],
        "schedule list": ["schedule", "list"],
        "schedule describe": ["schedule", "describe", "no-such-schedule"],
        "schedule pause": ["schedule", "pause", "no-such-schedule"],
        "schedule unpause": ["schedule", "unpause", "no-such-schedule"],
        "schedule trigger": ["schedule", "trigger", "no-such-schedule"],
        "schedule delete": ["schedule", "delete", "no-such-schedule"],
        "deployment list": ["deployment", "list"],
        "deployment versions": ["deployment", "versions", "-d", "no-such-deployment"],
        "deployment set-current": ["deployment", "set-current", "no-such-build"],
        "deployment ramp": ["deployment", "ramp", "--stop", "-d", "no-such-deployment"],
        "deployment drain": ["deployment", "drain", "no-such-build"],
        "callback": ["callback", "no-such-token", "--heartbeat"],
        "eval dataset": ["eval", "dataset", "--worker", "nobody", "-o", str(tmp / "ds.jsonl")],
        "eval run": ["eval", "run", missing, "--model", "default"],
        "eval show": ["eval", "show", missing, "item"],
    }


DRIVER = """
import json, os, sys
from aiworker.workers.cli.main import main

codes = {}
for path, argv in json.loads(sys.argv[1]).items():
    try:
        codes[path] = main(argv)
    except SystemExit as e:
        codes[path] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
with open(sys.argv[2], "w") as f:
    json.dump(codes, f)
os._exit(0)  # as exit_process: no interpreter finalization under Core's threads
"""


def test_every_client_command_has_an_invocation(tmp_path: Path) -> None:
    # A new command fails here until it is walked below (or named a process command).
    known = command_paths(build_parser())
    walked = set(invocations(tmp_path))
    assert known - PROCESS_COMMANDS == walked
    assert PROCESS_COMMANDS <= known


async def test_every_cli_command_is_a_span_with_its_exit_code(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    with running_rotel(tmp_path) as rotel:
        await wait_until(rotel.ready, "rotel to listen")
        proc_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))
        }
        proc_env.update(
            TEMPORAL_ADDRESS=env.client.service_client.config.target_host,
            TEMPORAL_NAMESPACE=env.client.namespace,
            AIWORKER_DATA_DIR=str(tmp_path / "data"),
            OTEL_EXPORTER_OTLP_ENDPOINT=rotel.endpoint,
            OTEL_LOGS_EXPORTER="none",
        )
        # Each driver process runs main() for its share of the commands, one after
        # another, and ends each as the console script does (SystemExit -> its code):
        # three interpreters instead of one per command on a 2-core machine.
        walk = invocations(tmp_path)
        shares = [dict(list(walk.items())[i::3]) for i in range(3)]
        procs = []
        for i, share in enumerate(shares):
            out = tmp_path / f"codes-{i}.json"
            procs.append(
                (
                    out,
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-c",
                        DRIVER,
                        json.dumps(share),
                        str(out),
                        env=proc_env,
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.DEVNULL,
                        stderr=asyncio.subprocess.PIPE,
                    ),
                )
            )
        codes: dict[str, int] = {}
        for out, p in procs:
            _, err = await asyncio.wait_for(p.communicate(), 240)
            assert p.returncode == 0, err.decode()[-3000:]
            assert b"Traceback" not in err, err.decode()[-3000:]
            codes.update(json.loads(out.read_text()))
        assert codes.keys() == walk.keys()

        def spans() -> dict[str, Block]:
            return {
                b.header.get("Name", ""): b
                for b in rotel.blocks("Span")
                if b.attributes.get("aiworker.command")
            }

        names = {path: span_name(build_parser().parse_args(walk[path])) for path in codes}
        expected = set(names.values())
        await wait_until(
            lambda: expected <= spans().keys(),
            lambda: f"a span for each of {sorted(expected - spans().keys())}",
        )
        got = spans()
    for path, code in codes.items():
        span = got[names[path]]
        command, _, action = names[path].removeprefix("aiworker ").partition(" ")
        assert span.attributes["aiworker.command"] == command
        assert span.attributes.get("aiworker.action", "") == action
        assert span.attributes["process.exit.code"] == str(code), path
        assert span.resource["service.name"] == "aiworker-cli"
        status = span.header.get("Status code", "")
        assert status == ("STATUS_CODE_UNSET" if code == 0 else "STATUS_CODE_ERROR"), path
    # The walk covered successes and failures alike.
    assert codes["list"] == 0 and codes["check"] == 0 and codes["schemas"] == 0
    assert codes["review"] == 3 and codes["redrive"] == 3
    assert got["aiworker review"].attributes["aiworker.outcome"] == "not_found"
    assert got["aiworker list"].attributes["aiworker.outcome"] == "ok"
