"""Where the worker's CPU goes: the throughput shapes under py-spy, by module.

``python -m bench.profile`` (``make profile``) starts a child process that
runs the bench worker (``bench.throughput.bench_stack``: the production
sandbox) on a fresh embedded server, warms it up, then samples it with
``py-spy record --pid`` while it runs bursts of every shape (chain-1,
chain-3, fanout-5) at 20 in flight. Start-up and warm-up are not sampled.
It prints the share of samples per module group, self (the frame on top of
the stack), charged (self plus the generic stdlib, asyncio and import-system
frames it called) and inclusive (anywhere in the stack), and the top
functions. Only the thread holding the GIL is sampled (``--gil``).

Only Python frames are sampled: the SDK core's Rust threads and the Temporal
server (another process) are not in the shares; ``python_share_of_cpu`` says
how much of the child's CPU the samples stand for. The client that starts
the pipelines runs in the same process and is part of the figures.

``--bare`` profiles the bare workflow instead, for comparison. py-spy comes
with the profile extra (``pip install -e '.[profile]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from bench.common import process_cpu_seconds, table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
# our packages: their folders at the repository root (aiworker/ links to them)
OURS = ("schemas", "activities", "workflows", "workers", "bench", "aiworker")
# (substring of a frame's file, group), first match wins
GROUPS = (
    ("/temporalio/worker/workflow_sandbox/_importer", "temporalio sandbox importer"),
    ("/temporalio/worker/workflow_sandbox/", "temporalio sandbox (other)"),
    ("/temporalio/converter", "temporalio converter"),
    ("/temporalio/worker/_workflow_instance", "temporalio workflow instance"),
    ("/temporalio/", "temporalio (other)"),
    ("/google/protobuf/", "protobuf"),
    ("/pydantic_core/", "pydantic"),
    ("/pydantic/", "pydantic"),
    ("/jsonschema", "jsonschema"),
    ("/referencing/", "jsonschema"),
    ("/opentelemetry/", "opentelemetry"),
    ("/prometheus_client/", "prometheus"),
    ("/json/", "json (stdlib)"),
    ("/logging/", "logging (stdlib)"),
    ("/asyncio/", "asyncio (stdlib)"),
    ("<frozen importlib", "import system (stdlib)"),
    ("<frozen ", "stdlib (other)"),
    ("/importlib/", "import system (stdlib)"),
)


# groups that do no work of their own: their self time is charged to the nearest
# caller in another group ("charged" shares)
GENERIC = frozenset({"stdlib (other)", "asyncio (stdlib)", "import system (stdlib)", "other"})
# the profiled child's own driver frames (the stack's roots), left out of the shares
DRIVER = ("/bench/profile.py", "<frozen runpy>")


def group(filename: str) -> str:
    """The module group a frame's file belongs to."""
    if filename.startswith(f"{ROOT}/"):
        # aiworker/<package> links to the root's <package>: one name for both
        parts = filename[len(str(ROOT)) + 1 :].split("/")
        sub = parts[1] if parts[0] == "aiworker" and len(parts) > 2 else parts[0]
        if sub in OURS:
            return "bench" if sub == "bench" else f"aiworker.{sub}"
    if filename == "<string>":
        return "temporalio sandbox (other)"  # the sandbox runs workflow code exec'd from strings
    for needle, name in GROUPS:
        if needle in filename:
            return name
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/")[0]
    return "stdlib (other)" if filename.startswith(sys.base_prefix) else "other"


def _frame(text: str) -> tuple[str, str]:
    """(function, file) of one raw py-spy frame ``func (file:line)``."""
    func, _, rest = text.rpartition(" (")
    return func, rest.rstrip(")").rsplit(":", 1)[0]


def summarize(raw: str, top: int = 20) -> dict[str, Any]:
    """Self and inclusive shares by module group and by function of py-spy's raw
    (collapsed) output: one ``frame;frame;... count`` line per stack."""
    total = 0
    self_g: Counter[str] = Counter()
    incl_g: Counter[str] = Counter()
    charged: Counter[str] = Counter()
    bodies: Counter[str] = Counter()
    self_f: Counter[str] = Counter()
    incl_f: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = [_frame(f) for f in stack.split(";")]
        frames = [f for f in frames if not f[1].endswith(DRIVER)] or frames
        total += count
        funcs = [f"{_short(file)}:{func}" for func, file in frames]
        groups = [group(file) for _, file in frames]
        self_g[groups[-1]] += count
        charged[next((g for g in reversed(groups) if g not in GENERIC), groups[-1])] += count
        self_f[funcs[-1]] += count
        for g in set(groups):
            incl_g[g] += count
        for f in set(funcs):
            incl_f[f] += count
        # a module body on the stack: an import (in the sandbox: for each new run)
        for m in {_short(file) for func, file in frames if func == "<module>"}:
            bodies[m] += count

    def shares(c: Counter[str], n: int | None = None) -> dict[str, float]:
        return {k: round(v / total, 4) for k, v in c.most_common(n)} if total else {}

    return {
        "samples": total,
        "self_by_group": shares(self_g),
        "charged_by_group": shares(charged),
        "inclusive_by_group": shares(incl_g),
        "self_by_function": shares(self_f, top),
        "inclusive_by_function": shares(incl_f, top),
        "module_bodies_inclusive": shares(bodies, top),
    }


def _short(filename: str) -> str:
    if filename.startswith(f"{ROOT}/"):
        return filename[len(str(ROOT)) + 1 :]
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    return filename.removeprefix(f"{sys.base_prefix}/lib/")


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy not found: pip install -e '.[profile]'")
    return found


def _line(stream: IO[str], wanted: Callable[[str], bool]) -> str | None:
    """The child's first output line that is ``wanted`` (others pass through), or
    None at its end."""
    for line in stream:
        if wanted(line.strip()):
            return line.strip()
        print(line, end="")
    return None


def profile(bare: bool, quick: bool, rate: int, regular: bool = False) -> dict[str, Any]:
    """Run the child, sample it after its warm-up, and summarize the samples."""
    child_argv = [sys.executable, "-m", "bench.profile", "--child"]
    child_argv += ["--bare"] * bare + ["--quick"] * quick + ["--regular"] * regular
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with tempfile.TemporaryDirectory(prefix="aiworker-profile-") as tmp:
        out = Path(tmp) / "raw.txt"
        child = subprocess.Popen(
            child_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert child.stdin is not None and child.stdout is not None
        try:
            if _line(child.stdout, lambda x: x == "ready") is None:
                raise SystemExit("the profiled child did not start")
            spy = subprocess.Popen(
                [
                    _py_spy(),
                    "record",
                    "--pid",
                    str(child.pid),
                    "--format",
                    "raw",
                    "--full-filenames",
                    "--nolineno",
                    # only the thread holding the GIL: Python actually running, not
                    # threads parked in a queue or in epoll (idle detection is
                    # unreliable in containers)
                    "--gil",
                    "-r",
                    str(rate),
                    "-o",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(1.0)  # py-spy attaches before the measured bursts start
            cpu0 = process_cpu_seconds(child.pid)
            child.stdin.write("go\n")
            child.stdin.flush()
            report = json.loads(_line(child.stdout, lambda x: x.startswith("{")) or "{}")
            cpu = process_cpu_seconds(child.pid) - cpu0
            child.stdin.write("exit\n")
            child.stdin.flush()
            child.wait(timeout=60)
            _, err = spy.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
        if not out.exists():
            raise SystemExit(f"py-spy wrote no samples: {err.strip()}")
        raw = out.read_text()
        summary = summarize(raw)
    RESULTS.mkdir(exist_ok=True)
    # the collapsed stacks themselves, for flame graphs and diffs (kept local)
    (RESULTS / f"profile-{_name(bare, regular)}.raw.txt").write_text(raw)
    summary.update(report)
    summary["path"] = _name(bare, regular)
    summary["rate_hz"] = rate
    summary["process_cpu_s"] = round(cpu, 2)
    summary["python_share_of_cpu"] = round(summary["samples"] / rate / cpu, 3) if cpu else None
    pipelines = report["pipelines_per_case"] * len(report["per_s"])
    summary["process_cpu_ms_per_pipeline"] = round(cpu * 1000 / pipelines, 1)
    summary["gil_ms_per_pipeline"] = round(summary["samples"] / rate * 1000 / pipelines, 1)
    return summary


def _name(bare: bool, regular: bool) -> str:
    return ("bare" if bare else "aiworker") + ("-regular" * regular)


async def _child(bare: bool, quick: bool, regular: bool) -> None:
    from bench.throughput import CASES, _burst, bench_stack, starters

    count = 60 if quick else 200
    async with bench_stack(local=not regular) as (client, queue, _):
        paths = {
            f"{k}-{n}": starters(client, queue, k, n)["bare" if bare else "aiworker"]
            for k, n in CASES
        }
        for start in paths.values():
            await _burst(start, 10, 10, None)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        t0 = time.perf_counter()
        per_s = {
            case: round((await _burst(s, count, 20, None))["per_s"], 1) for case, s in paths.items()
        }
        print(
            json.dumps(
                {
                    "pipelines_per_case": count,
                    "per_s": per_s,
                    "wall_s": round(time.perf_counter() - t0, 1),
                }
            ),
            flush=True,
        )
        await asyncio.to_thread(sys.stdin.readline)


def _print(s: dict[str, Any]) -> None:
    print(
        f"py-spy on the {s['path']} worker: {s['samples']} samples at {s['rate_hz']} Hz, "
        f"{s['pipelines_per_case']} pipelines per shape at 20 in flight (per second: "
        f"{s['per_s']})\nper pipeline: process CPU {s['process_cpu_ms_per_pipeline']} ms, "
        f"GIL held {s['gil_ms_per_pipeline']} ms (GIL-held time / process CPU = "
        f"{s['python_share_of_cpu']}: the SDK core's Rust threads use CPU without the GIL, "
        "a GIL holder may wait for a core)"
    )
    groups = sorted(s["inclusive_by_group"], key=lambda g: -s["inclusive_by_group"][g])
    rows = [
        {
            "module group": g,
            "self %": _pct(s["self_by_group"].get(g, 0)),
            "charged %": _pct(s["charged_by_group"].get(g, 0)),
            "inclusive %": _pct(s["inclusive_by_group"][g]),
        }
        for g in groups
    ]
    print(
        "\nself: the group's own frames on top; charged: self, plus the stdlib, asyncio and\n"
        "import-system time it called (100% in all); inclusive: anywhere on the stack\n"
        + table(rows, ["module group", "self %", "charged %", "inclusive %"])
    )
    for key, title in (
        ("self_by_function", "self"),
        ("inclusive_by_function", "inclusive"),
        ("module_bodies_inclusive", "inclusive (module bodies: imports)"),
    ):
        rows = [{"function": f, f"{title} %": _pct(v)} for f, v in s[key].items()]
        print(f"\ntop functions by {title} share\n" + table(rows, ["function", f"{title} %"]))


def _pct(v: float) -> str:
    return f"{v * 100:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.profile [--bare] [--quick] [--rate HZ]``."""
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n")[0])
    p.add_argument("--bare", action="store_true", help="profile the bare workflow instead")
    p.add_argument("--quick", action="store_true", help="60 pipelines per shape, not 200")
    p.add_argument(
        "--regular",
        action="store_true",
        help="every step a regular activity (validator steps too), not the local default",
    )
    p.add_argument("--rate", type=int, default=100, help="samples per second (default 100)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        asyncio.run(_child(args.bare, args.quick, args.regular))
        return 0
    summary = profile(args.bare, args.quick, args.rate, args.regular)
    _print(summary)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"profile-{summary['path']}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nwritten {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
