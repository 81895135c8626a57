"""The ``aiworker`` command line's grammar: commands, arguments and flags.

Names, flags and defaults are a user-facing contract (docs/cli.md); the commands
themselves live in :mod:`aiworker.workers.cli.main`, one function each.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from aiworker.schemas.names import TENANT_PATTERN
from aiworker.workers.cli.common import positive_int
from aiworker.workers.cli.eval_commands import add_eval_commands


def positive_seconds(value: str) -> float:
    """A number of seconds in (0, 3600], for ``argparse``."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 < seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 3600 seconds")
    return seconds


def port_number(value: str) -> int:
    """A TCP port in [0, 65535] (0: any free one), for ``argparse``."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not between 0 and 65535")
    return port


def tenant_name(value: str) -> str:
    """A tenant name (``TENANT_PATTERN``), for ``argparse``."""
    if re.fullmatch(TENANT_PATTERN.strip("^$"), value) is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a tenant name: 1-63 of a-z, 0-9, '.', '_', '-', "
            "starting with a letter or digit"
        )
    return value


def _schedule_value(parse_name: str) -> Callable[[str], Any]:
    """An ``argparse`` type from a parser of :mod:`aiworker.workers.schedules.specs`
    (imported when a schedule flag is given, not for every command)."""

    def parse(value: str) -> Any:
        from aiworker.workers.schedules import specs as schedule_specs

        try:
            return getattr(schedule_specs, parse_name)(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = parse_name
    return parse


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, like every other failure."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message> (see <prog> --help)`` and exit 2."""
        print(f"{self.prog}: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


# `aiworker dev --site` without a port: free of the Temporal server (7233), its UI
# (8233), `serve` (8000) and the metrics (9464).
DEFAULT_SITE_PORT = 8081

JSON_RESULT_HELP = "print the whole result JSON and no progress (what scripts parse)"
FIELD_HELP = (
    "print this field of the pipeline's output whole in the summary table (repeatable; "
    "long fields are cut otherwise)"
)
DEBUG_HELP = "print the traceback of a failure (each failure is one line otherwise)"


def build_parser() -> argparse.ArgumentParser:
    """The ``aiworker`` command line: its commands and flags (a contract: docs/cli.md)."""
    p = Parser(prog="aiworker", description="Durable AI workers on Temporal.")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = p.add_subparsers(dest="command", required=True)

    def conn(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--address",
            help=(
                "Temporal frontend host:port (default: TEMPORAL_ADDRESS or the envconfig "
                "profile, else the aiworker dev stack recorded in this folder, else "
                "localhost:7233)"
            ),
        )
        sp.add_argument("--profile", help="envconfig profile name")

    w = sub.add_parser("worker", help="run a worker process")
    w.add_argument(
        "-q",
        "--task-queue",
        action="append",
        help="base task queue to poll (repeatable; default AIWORKER_TASK_QUEUES or all)",
    )
    w.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the Temporal frontend to be healthy (default 60)",
    )
    conn(w)

    r = sub.add_parser(
        "run",
        help="start a pipeline, show its progress and a summary",
        description="Start a pipeline and wait for it: a live progress line on a terminal, "
        "one line per step status change otherwise, then a summary table of its steps. "
        "--json prints the whole result JSON instead (for scripts).",
    )
    r.add_argument("file", help="pipeline JSON file, or - for stdin")
    r.add_argument("--no-wait", action="store_true", help="print the workflow id and return")
    r.add_argument("--json", action="store_true", help=JSON_RESULT_HELP)
    r.add_argument("--id", help="workflow id (default: <name>-<random>)")
    r.add_argument("--field", action="append", metavar="FIELD", help=FIELD_HELP)
    r.add_argument(
        "--accept-quote",
        action="store_true",
        help="start even when the cost quote is above the tenant's quote_accept_above_usd",
    )
    conn(r)

    ck = sub.add_parser(
        "check",
        help="check a pipeline without running it (exit 0 valid, 2 invalid)",
        description="Check a pipeline file as `aiworker run` would, before anything starts: "
        "the spec, each step's input against its worker's contract, references, selectors, "
        "schemas, model aliases and tenants. One line per problem. Checks against the "
        "workers the live registry lists when Temporal answers within a few seconds, else "
        "against local specs (spec files, installed plugins); stderr says which.",
    )
    ck.add_argument("file", help="pipeline JSON file, or - for stdin")
    ck.add_argument(
        "--json",
        action="store_true",
        help="print the problems as a JSON list of {step, field, path, message, suggestion}",
    )
    ck.add_argument(
        "--local",
        action="store_true",
        help="check against this process's spec files and plugins, not the live registry",
    )
    ck.add_argument(
        "--quote",
        action="store_true",
        help="estimate tokens, external calls, cost_usd and duration_s (p50, p95) from the "
        "recorded calls of the same workers, and list what could not be estimated "
        "(docs/cost.md)",
    )
    conn(ck)

    for name, helptext in (
        ("dev", "embedded Temporal server, UI and worker"),
        ("demo", "dev stack plus the sample pipeline"),
    ):
        d = sub.add_parser(name, help=helptext)
        d.add_argument(
            "--port",
            type=int,
            default=7233,
            help="the Temporal server's gRPC port on 127.0.0.1 (default 7233); commands "
            "run beside the stack find it by themselves (docs/running.md)",
        )
        d.add_argument(
            "--ui-port",
            type=int,
            default=8233,
            help="the Temporal Web UI's port on 127.0.0.1 (default 8233)",
        )
        d.add_argument("--headless", action="store_true", help="no Web UI")
        d.add_argument(
            "--data-dir",
            help="where the server's database, logs and the stack's dev.json and "
            "temporal.toml live (default AIWORKER_DATA_DIR or ./.aiworker)",
        )
        d.add_argument(
            "--fast-poll",
            action="store_true",
            help="lower idle latency at some cost of peak throughput",
        )
        d.add_argument(
            "--no-model",
            action="store_true",
            help="do not start the local model as the `default` alias when none is configured",
        )
        if name == "dev":
            d.add_argument(
                "--site",
                nargs="?",
                type=port_number,
                const=DEFAULT_SITE_PORT,
                metavar="PORT",
                help="also serve the bundled sample shop on http://127.0.0.1:PORT "
                f"(default {DEFAULT_SITE_PORT}; 0: any free port)",
            )
            d.add_argument(
                "--terminate-other-builds",
                action="store_true",
                help="terminate the running runs of earlier builds (the code before an "
                "edit) at start; default: say which, and leave them to their build",
            )
        if name == "demo":
            d.add_argument("--pipeline", help="pipeline file (default: the bundled sample)")
            d.add_argument("--exit", action="store_true", help="stop after the pipeline ends")
            d.add_argument("--json", action="store_true", help=JSON_RESULT_HELP)

    rv = sub.add_parser("review", help="decide on a step awaiting review (Workflow Update)")
    rv.add_argument("workflow_id")
    rv.add_argument("decision", choices=["approve", "reject", "retry"])
    rv.add_argument("--outputs", help="corrected outputs as JSON (approve)")
    rv.add_argument("--reviewer", help="who decides (default $USER)")
    rv.add_argument("--note", help="a note kept in the step's result")
    rv.add_argument("--step", help="the step, when several await review")
    conn(rv)

    cb = sub.add_parser(
        "callback", help="complete, fail or extend a wait step's token (Workflow Update)"
    )
    cb.add_argument("token", help="the token (${{ steps.<id>.token }})")
    answer = cb.add_mutually_exclusive_group(required=True)
    answer.add_argument(
        "--outputs", help="complete: the step's outputs as JSON (checked against wait.schema)"
    )
    answer.add_argument("--fail", metavar="MESSAGE", help="fail the step with this reason")
    answer.add_argument(
        "--heartbeat", action="store_true", help="extend the wait (by --extend or its timeout)"
    )
    cb.add_argument(
        "--extend",
        type=float,
        metavar="SECONDS",
        help="with --heartbeat: the new deadline is now plus this (default: the step's "
        "timeout_seconds)",
    )
    conn(cb)

    ls = sub.add_parser("list", help="list pipelines through visibility queries")
    ls.add_argument("--status", help="e.g. running, awaiting_review, failed")
    ls.add_argument("--tenant", type=tenant_name)
    ls.add_argument("--pipeline", help="pipeline name")
    ls.add_argument("--limit", type=int, default=100)
    ls.add_argument("--json", action="store_true")
    conn(ls)

    def bulk(sp: argparse.ArgumentParser, action: str) -> None:
        sp.add_argument(
            "--query",
            metavar="Q",
            help=f"{action} every pipeline this visibility query matches (e.g. "
            "\"AiworkerStatus = 'failed' AND StartTime > '2026-11-01T00:00:00Z'\"), "
            "within --tenant (default: the default tenant) unless --all-tenants",
        )
        sp.add_argument("--tenant", type=tenant_name, help="with --query: the tenant's pipelines")
        sp.add_argument(
            "--all-tenants", action="store_true", help="with --query: every tenant's pipelines"
        )
        sp.add_argument(
            "--dry-run", action="store_true", help="with --query: print the count and first ids"
        )
        sp.add_argument(
            "--yes",
            action="store_true",
            help="with --query: do not ask for confirmation above the threshold",
        )

    for name, helptext in (
        ("cancel", "cancel a running pipeline (or every one --query matches)"),
        ("terminate", "terminate a running pipeline (or every one --query matches)"),
    ):
        st = sub.add_parser(name, help=helptext)
        st.add_argument("workflow_id", nargs="?")
        bulk(st, name)
        st.add_argument("--reason", help="recorded with the termination (or batch job)")
        conn(st)

    rd = sub.add_parser("redrive", help="run a failed pipeline again, reusing succeeded steps")
    rd.add_argument("workflow_id", nargs="?")
    bulk(rd, "redrive")
    rd.add_argument(
        "--from",
        dest="from_step",
        metavar="STEP",
        help="rerun STEP and everything downstream of it (also after a success), reusing the rest",
    )
    rd.add_argument(
        "--input",
        dest="step_input",
        action="append",
        metavar="STEP=JSON",
        help="a corrected input (a JSON object) for the --from step, checked against its "
        "worker's input schema as the run recorded it",
    )
    rd.add_argument(
        "--new-idempotency-keys",
        action="store_true",
        help="steps that run again take new idempotency keys (side effects happen again); "
        "default: the first run's keys",
    )
    rd.add_argument("--no-wait", action="store_true", help="print the new workflow id and return")
    rd.add_argument("--json", action="store_true", help=JSON_RESULT_HELP)
    rd.add_argument("--field", action="append", metavar="FIELD", help=FIELD_HELP)
    conn(rd)

    ws = sub.add_parser(
        "workers",
        help="list the live workers and the processes serving them (offline: the specs)",
        description="The workers the live registry lists, with the worker processes and "
        "build ids serving each, and any worker id and version served with different specs "
        "(on stderr); when Temporal or the registry does not answer, the worker specs this "
        "process knows (spec files, installed plugins), saying so.",
    )
    ws.add_argument("--json", action="store_true")
    ws.add_argument("--local", action="store_true", help="list local specs only")
    conn(ws)

    ar = sub.add_parser("artifacts", help="list the artifacts a workflow wrote (lineage)")
    ar.add_argument("workflow_id")
    ar.add_argument("--json", action="store_true", help="one JSON array with every field")

    it = sub.add_parser(
        "items",
        help="a for_each step's items as JSON Lines (inline or by reference)",
        description="Print each item's outputs of a for_each step, one JSON document per "
        "line in item order (null where an item failed), once the pipeline has ended: "
        "from its result, or from the artifact store when the step had more than "
        "AIWORKER_FOREACH_INLINE_ITEMS items. Exit 3 when the workflow or step does not "
        "exist, 2 when the step is not a for_each, 1 when a stored part cannot be read.",
    )
    it.add_argument("workflow_id")
    it.add_argument("step_id")
    it.add_argument("--run-id", help="the run (default: the latest)")
    conn(it)

    rp = sub.add_parser(
        "replay",
        help="replay recorded histories against this code (the replay gate; exit 1 at the "
        "first nondeterminism)",
        description="Replay workflow histories with the SDK's Replayer, with the workflows, "
        "sandbox, data converter and worker catalog of a worker process: files as "
        "`temporal workflow show --output json` writes them (a directory: its *.json), "
        "and with --query the histories of workflows (closed or running) a visibility "
        "query finds. Exit 0 when all replay, 1 at the first that does not (naming the "
        "history and the event), 2 for bad usage or a malformed file.",
    )
    rp.add_argument("files", nargs="*", metavar="HISTORY", help="history file or directory")
    rp.add_argument(
        "--query",
        help="a visibility query, e.g. \"WorkflowType='PipelineWorkflow' AND "
        "ExecutionStatus='Running'\" ('' for every workflow)",
    )
    rp.add_argument(
        "--limit",
        type=positive_int,
        default=100,
        help="at most this many workflows from --query (default 100)",
    )
    rp.add_argument("--quiet", action="store_true", help="no line per history that replayed")
    conn(rp)

    sc = sub.add_parser("schemas", help="export or check schemas/json and the generated docs")
    sc.add_argument("action", choices=["export", "check"])

    cf = sub.add_parser("conformance", help="check a live worker against its spec through Temporal")
    cf.add_argument("worker_id")
    cf.add_argument(
        "--network", action="store_true", help="also run examples that reach a site or a model"
    )
    cf.add_argument(
        "--side-effects",
        action="store_true",
        help="also run the examples of a worker with side effects (publish)",
    )
    cf.add_argument("--all", action="store_true", help="--network and --side-effects")
    cf.add_argument("--examples", help="a JSON file of examples to run instead of the spec's")
    cf.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        help="seconds each call may take, retries included (default 60)",
    )
    cf.add_argument(
        "--tenant", type=tenant_name, default="default", help="the tenant of the requests"
    )
    cf.add_argument("--json", action="store_true", help="print the report as JSON")
    conn(cf)
    sv = sub.add_parser(
        "serve",
        help="the HTTP front door: start, watch and review pipelines, webhooks",
        description="Serve the HTTP API (docs/serve.md) on AIWORKER_SERVE_HOST:"
        "AIWORKER_SERVE_PORT, with the keys of AIWORKER_API_KEYS_FILE and the hooks of "
        "AIWORKER_HOOKS_FILE, until SIGTERM or Ctrl-C.",
    )
    sv.add_argument("--host", help="address to listen on (default AIWORKER_SERVE_HOST or 0.0.0.0)")
    sv.add_argument(
        "--port",
        type=port_number,
        help="port to listen on (default AIWORKER_SERVE_PORT or 8000; 0: any)",
    )
    sv.add_argument(
        "--without-api-keys",
        action="store_true",
        help="start with no API key (no AIWORKER_API_KEYS_FILE, or one without keys): every "
        "/v1/pipelines request is refused, only webhooks and callbacks are served; without "
        "this flag, no API key stops the command (exit 2)",
    )
    conn(sv)

    ks = sub.add_parser("keys", help="manage the front door's API keys (stored hashed)")
    ks_sub = ks.add_subparsers(dest="keys_action", required=True)
    ka = ks_sub.add_parser(
        "add",
        help="draw a new API key, store its hash, print the key once",
        description="Draw a new API key (or read one from stdin with --stdin), add its "
        "SHA-256 to the keys file under NAME for TENANT, and print the key on stdout: it "
        "is not stored anywhere else.",
    )
    ka.add_argument("name", help="who holds the key (unique in the file)")
    ka.add_argument("--tenant", type=tenant_name, required=True, help="the tenant it acts for")
    ka.add_argument("--file", help="the keys file (default AIWORKER_API_KEYS_FILE)")
    ka.add_argument("--rate-limit", help="this key's rate, e.g. 60/min (default the setting's)")
    ka.add_argument(
        "--stdin", action="store_true", help="hash the key read from stdin instead of a new one"
    )
    for command in ks_sub.choices.values():
        command.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
        )

    schedule_parsers = add_schedule_commands(sub, conn)
    schedule_parsers += add_deployment_commands(sub, conn)
    schedule_parsers += add_eval_commands(sub, conn, tenant_name)
    # Every command takes --debug after its name too; SUPPRESS keeps the global
    # flag's value when the command does not repeat it.
    for each in [*sub.choices.values(), *schedule_parsers]:
        each.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
        )
    return p


def add_schedule_commands(
    sub: argparse._SubParsersAction[Parser],
    conn: Callable[[argparse.ArgumentParser], None],
) -> list[argparse.ArgumentParser]:
    """``aiworker schedule create|list|describe|pause|unpause|trigger|delete``; the
    flags of ``create`` are ``temporal schedule create``'s. Returns the parsers."""
    sch = sub.add_parser(
        "schedule",
        help="run a pipeline on a Temporal Schedule",
        description="Pipelines on a Temporal Schedule: the Temporal UI's Schedules page and "
        "`temporal schedule ...` show and change them too.",
    )
    actions = sch.add_subparsers(dest="action", required=True)
    overlap = _schedule_value("overlap_policy")
    duration = _schedule_value("parse_duration")

    cr = actions.add_parser(
        "create",
        help="check a pipeline file and create a schedule that runs it",
        description="Check FILE as `aiworker run` does (exit 2, nothing created, when it is "
        "invalid), then create a schedule whose runs start it as workflow "
        "<workflow id>-<nominal time>. Give --cron, --interval or both.",
    )
    cr.add_argument("file", help="pipeline JSON file, or - for stdin")
    cr.add_argument("-s", "--schedule-id", help="the schedule id (default: the pipeline's name)")
    cr.add_argument(
        "--cron",
        action="append",
        help='a cron line, e.g. "30 2 * * *" or @daily (repeatable)',
    )
    cr.add_argument(
        "--interval",
        action="append",
        type=_schedule_value("parse_interval"),
        help="EVERY[/OFFSET], e.g. 15m or 6h/5h (repeatable)",
    )
    cr.add_argument("--time-zone", help="IANA time zone of the cron lines (default UTC)")
    cr.add_argument("--jitter", type=duration, help="start each run up to this much later")
    cr.add_argument(
        "--catchup-window",
        type=duration,
        help="how late a missed run may still start (default: the server's, a year)",
    )
    cr.add_argument(
        "--overlap-policy",
        type=overlap,
        default="Skip",
        help="Skip (default), BufferOne, BufferAll, CancelOther, TerminateOther or AllowAll",
    )
    cr.add_argument(
        "--pause-on-failure", action="store_true", help="pause when a run's workflow fails"
    )
    cr.add_argument("--notes", help="the schedule's note")
    cr.add_argument("--paused", action="store_true", help="create it paused")
    cr.add_argument(
        "--workflow-id", help="each run's workflow id before its time (default: the schedule id)"
    )
    conn(cr)

    ls = actions.add_parser("list", help="one line per pipeline schedule")
    ls.add_argument("--tenant", type=tenant_name)
    ls.add_argument("--pipeline", help="pipeline name")
    ls.add_argument("--json", action="store_true")
    conn(ls)

    made: list[argparse.ArgumentParser] = [cr, ls]
    for name, helptext in (
        ("describe", "a schedule's spec, state, recent runs and next runs"),
        ("pause", "stop a schedule's runs until unpaused"),
        ("unpause", "resume a paused schedule"),
        ("trigger", "start one run now"),
        ("delete", "delete a schedule (the runs it started go on)"),
    ):
        a = actions.add_parser(name, help=helptext)
        a.add_argument("schedule_id", nargs="?", metavar="SCHEDULE_ID")
        a.add_argument("-s", "--schedule-id", dest="schedule_id_flag", help="the schedule id")
        if name == "describe":
            a.add_argument("--json", action="store_true")
        if name in ("pause", "unpause"):
            a.add_argument("--note", help="why (kept as the schedule's note)")
        if name == "trigger":
            a.add_argument(
                "--overlap-policy", type=overlap, help="this run's policy (default the schedule's)"
            )
        conn(a)
        made.append(a)
    return made


def add_deployment_commands(
    sub: Any, conn: Callable[[argparse.ArgumentParser], None]
) -> list[argparse.ArgumentParser]:
    """The ``aiworker deployment ...`` parsers (returned, for the shared ``--debug``)."""
    dep = sub.add_parser(
        "deployment",
        help="see worker deployment versions, set the current one, ramp, watch one drain",
        description="Worker processes poll as versions (build ids) of a Temporal Worker "
        "Deployment; new pipelines go to the current version and each run finishes on "
        "the build it started on. `temporal worker deployment ...` shows and changes "
        "the same.",
    )
    actions = dep.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("list", help="the worker deployments of the namespace")
    vs = actions.add_parser("versions", help="a deployment's builds: status, ramp, open runs")
    sc = actions.add_parser("set-current", help="send new pipelines to BUILD_ID")
    sc.add_argument("build_id", metavar="BUILD_ID")
    rp = actions.add_parser(
        "ramp", help="send PERCENT of new pipelines to BUILD_ID (the rest to the current)"
    )
    rp.add_argument("build_id", metavar="BUILD_ID", nargs="?")
    rp.add_argument("percent", metavar="PERCENT", type=float, nargs="?")
    rp.add_argument("--stop", action="store_true", help="stop ramping (all to the current)")
    dr = actions.add_parser(
        "drain", help="the runs still open on BUILD_ID; exit 0 once none is (safe to stop it)"
    )
    dr.add_argument("build_id", metavar="BUILD_ID")
    dr.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the build to drain (default: answer now)",
    )
    parsers = [ls, vs, sc, rp, dr]
    for p in parsers:
        conn(p)
        p.add_argument("--json", action="store_true", help="print JSON")
        if p is not ls:
            p.add_argument(
                "-d",
                "--deployment-name",
                help="the deployment (default: AIWORKER_DEPLOYMENT_NAME + the task-queue suffix)",
            )
    return parsers
