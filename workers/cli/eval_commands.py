"""``aiworker eval dataset|run|show``: evals from recorded history (docs/evals.md).

Beside :mod:`aiworker.workers.cli.main` (which lists :func:`cmd_eval` in its
``COMMANDS``); the parsers are :func:`add_eval_commands`. Exit codes: ``dataset``
0 written, 2 bad usage (an unknown worker, a malformed option), 3 nothing
matched; ``run`` 0 the gate holds, 1 the candidate regresses, 2 bad usage (a
malformed dataset, an invalid candidate spec or judge file, a refused
candidate); ``show`` 0, 3 no such item. Every refusal is one line on stderr
with its stable error code in parentheses.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiworker.workers.cli.common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    command_settings,
    err,
    positive_int,
)
from aiworker.workers.client.terminal import safe_text


def _fraction(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0.0 <= v:
        raise argparse.ArgumentTypeError(f"{value!r}: give 0 or more")
    return v


def _duration(value: str) -> Any:
    from aiworker.workers.schedules.specs import parse_duration

    try:
        return parse_duration(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _concurrency(value: str) -> int:
    from aiworker.schemas.evals import MAX_EVAL_CONCURRENCY

    n = positive_int(value)
    if n > MAX_EVAL_CONCURRENCY:
        raise argparse.ArgumentTypeError(f"{value!r}: at most {MAX_EVAL_CONCURRENCY}")
    return n


def add_eval_commands(
    sub: Any,
    conn: Callable[[argparse.ArgumentParser], None],
    tenant_name: Callable[[str], str],
) -> list[argparse.ArgumentParser]:
    """The ``aiworker eval ...`` parsers (returned, for the shared ``--debug``)."""
    ev = sub.add_parser(
        "eval",
        help="datasets from recorded calls, a candidate run against them, a CI gate",
        description="Evals from history: collect a worker's recorded calls into a dataset, "
        "run a candidate (a new prompt spec, another model alias, or another queue's "
        "workers) over it as a Temporal workflow, and compare (docs/evals.md).",
    )
    actions = ev.add_subparsers(dest="action", required=True)
    ds = actions.add_parser(
        "dataset", help="write a worker's recorded calls as a JSON Lines dataset"
    )
    ds.add_argument("--worker", required=True, metavar="ID", help="the worker id")
    ds.add_argument("--version", metavar="V", help="the worker's contract version")
    ds.add_argument("--tenant", type=tenant_name, metavar="T")
    ds.add_argument("--pipeline", metavar="NAME", help="the pipeline's name")
    ds.add_argument(
        "--since", type=_duration, metavar="DURATION", help="runs started within (24h, 7d)"
    )
    ds.add_argument(
        "--status", metavar="S", help="the call's status: succeeded, partial, failed, ..."
    )
    ds.add_argument("--error-code", metavar="CODE", help="a failed call's error code")
    ds.add_argument("--limit", type=positive_int, metavar="N", help="at most N calls (newest runs)")
    ds.add_argument("--output", "-o", required=True, metavar="FILE", help="the dataset file")

    rn = actions.add_parser("run", help="run a candidate over a dataset; compare; gate")
    rn.add_argument("dataset", metavar="DATASET", help="a dataset file (JSON Lines)")
    cand = rn.add_mutually_exclusive_group(required=True)
    cand.add_argument("--candidate", metavar="SPEC_FILE", help="a prompt worker's spec file")
    cand.add_argument("--model", metavar="ALIAS", help="the same worker on another model alias")
    cand.add_argument("--task-queue", metavar="Q", help="the worker as the processes on Q serve it")
    rn.add_argument("--judge", metavar="SPEC_FILE", help="an llm-call judge (rubric, schema)")
    rn.add_argument(
        "--max-pass-drop", type=_fraction, metavar="X", help="gate: largest pass-rate drop (0.05)"
    )
    rn.add_argument(
        "--max-cost-rise",
        type=_fraction,
        metavar="X",
        help="gate: largest relative rise in cost per item (0.2 = 20%%)",
    )
    rn.add_argument("--report", metavar="FILE", help="write the report JSON here")
    rn.add_argument("--markdown", metavar="FILE", help="write the Markdown report here")
    rn.add_argument("--schema", metavar="FILE", help="a validator JSON Schema for outputs")
    rn.add_argument(
        "--compare",
        action="append",
        metavar="FIELD=NAME",
        help="compare a field by exact, normalized, token_f1[:T] or ignore (repeatable)",
    )
    rn.add_argument("--budget-usd", type=_fraction, metavar="X", help="the eval's budget")
    rn.add_argument(
        "--concurrency", type=_concurrency, default=4, metavar="N", help="items at once (4)"
    )

    sh = actions.add_parser("show", help="one item of a report, as JSON")
    sh.add_argument("report", metavar="REPORT")
    sh.add_argument("item_id", metavar="ITEM_ID")
    for p in (ds, rn):
        conn(p)
    return [ds, rn, sh]


async def cmd_eval(args: argparse.Namespace) -> int:
    """``aiworker eval dataset|run|show``."""
    from aiworker.workers.evals.dataset import DatasetError
    from aiworker.workers.evals.run import EvalError

    action = {"dataset": eval_dataset, "run": eval_run, "show": eval_show}[args.action]
    try:
        return await action(args)
    except DatasetError as e:
        err(f"{e} ({e.code})")
        return EXIT_USAGE
    except EvalError as e:
        err(f"{e} ({e.code})")
        return e.exit_code


async def eval_dataset(args: argparse.Namespace) -> int:
    """``aiworker eval dataset``: the matching recorded calls, written as a dataset."""
    from aiworker.schemas.errors import ErrorCode
    from aiworker.workers.cli.common import command_client, command_view, configure_logs
    from aiworker.workers.evals.dataset import render
    from aiworker.workers.evals.recorded import CallQuery, recorded_calls
    from aiworker.workers.evals.run import EvalError

    settings = command_settings(args)
    configure_logs(settings)
    view = await command_view(args)
    if args.worker not in view.specs:
        raise EvalError(
            f"unknown worker {args.worker!r} ({view.describe()}); known: "
            f"{', '.join(sorted(view.specs))}",
            ErrorCode.NOT_FOUND,
        )
    client = await command_client(args)
    query = CallQuery(
        worker=args.worker,
        version=args.version,
        tenant=args.tenant,
        pipeline=args.pipeline,
        since=args.since,
        status=args.status,
        error_code=args.error_code,
        limit=args.limit,
    )
    calls = [c async for c in recorded_calls(client, query)]
    if not calls:
        why = ""
        if args.version:
            other = CallQuery(**{**query.__dict__, "version": None, "limit": 50})
            seen = sorted({c.version or "?" async for c in recorded_calls(client, other)})
            if seen:
                why = f"; its recorded versions are {', '.join(seen)}"
        raise EvalError(
            f"no recorded calls of worker {args.worker!r} match ({_described(args)}){why}",
            ErrorCode.NOT_FOUND,
            exit_code=EXIT_NOT_FOUND,
        )
    shown = {
        k: v
        for k, v in {
            "worker": args.worker,
            "version": args.version,
            "tenant": args.tenant,
            "pipeline": args.pipeline,
            "since": _since_text(args.since),
            "status": args.status,
            "error_code": args.error_code,
            "limit": args.limit,
        }.items()
        if v is not None
    }
    data = render(calls, shown)
    out = Path(args.output)
    try:
        _write(out, data)
    except OSError as e:
        raise EvalError(f"cannot write {out}: {e.strerror}") from None
    header = json.loads(data.split(b"\n", 1)[0])
    print(f"wrote {header['items']} items to {out} (sha256 {header['sha256'][:16]})")
    return EXIT_OK


def _read(path: str) -> str:
    return Path(path).read_text("utf-8")


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _since_text(value: Any) -> str | None:
    if value is None:
        return None
    return f"{int(value.total_seconds())}s"


def _described(args: argparse.Namespace) -> str:
    parts = [
        f"{k}={getattr(args, k)}"
        for k in ("version", "tenant", "pipeline", "status", "error_code")
        if getattr(args, k, None)
    ]
    if args.since is not None:
        parts.append(f"since={_since_text(args.since)}")
    return ", ".join(parts) or "any run"


async def eval_run(args: argparse.Namespace) -> int:
    """``aiworker eval run``: the candidate over the dataset, the report, the gate."""
    from aiworker.schemas import names, safe_schema
    from aiworker.workers.cli.common import command_client, command_view, configure_logs
    from aiworker.workers.evals import report as rep
    from aiworker.workers.evals.dataset import load
    from aiworker.workers.evals.run import (
        CandidateChoice,
        EvalError,
        candidate_label,
        choose_candidate,
        dataset_worker,
        eval_input,
        eval_workflow_id,
        read_judge_file,
        start_eval,
    )

    settings = command_settings(args)
    configure_logs(settings)
    dataset = load(args.dataset)
    compare: dict[str, rep.Comparison] = {}
    for text in args.compare or ():
        try:
            fname, cmp = rep.parse_compare(text)
        except ValueError as e:
            raise EvalError(str(e)) from None
        compare[fname] = cmp
    validator_schema = None
    if args.schema:
        try:
            validator_schema = json.loads(_read(args.schema))
            safe_schema.check(validator_schema)
        except (OSError, ValueError) as e:
            raise EvalError(f"invalid --schema {args.schema}: {e}") from None
        except Exception as e:  # a schema the safe checker refuses
            raise EvalError(f"invalid --schema {args.schema}: {e}") from None
    judge = read_judge_file(args.judge) if args.judge else None
    view = await command_view(args)
    aliases = view.aliases
    if aliases is None:
        from aiworker.workers.process.pipeline_settings import model_aliases

        aliases = model_aliases(settings)
    choice = CandidateChoice(
        spec_file=args.candidate,
        model=args.model,
        task_queue=args.task_queue,
    )
    worker = dataset_worker(dataset)
    cand = choose_candidate(choice, worker, view.specs, aliases)
    # the contract both sides are held to: the recorded worker's, which a candidate
    # must keep (the candidate's own when the dataset names no known worker)
    recorded = view.specs.get(worker) if worker else None
    contract = (recorded or cand.spec).output_schema
    judge_spec = view.specs.get(names.LLM_CALL) if judge else None
    if judge is not None and judge_spec is None:
        raise EvalError("--judge needs the llm-call worker, which no known process serves")
    inp = eval_input(
        dataset,
        cand,
        settings,
        judge=judge,
        judge_spec=judge_spec,
        max_cost_usd=args.budget_usd,
        concurrency=args.concurrency,
    )
    client = await command_client(args)
    workflow_id = eval_workflow_id(dataset, inp)
    handle = await start_eval(client, settings, workflow_id, inp)
    err(f"eval {workflow_id}: {len(inp.items)} items through {candidate_label(cand)}")
    result = await handle.result()
    for r in result.items:
        if r.error_code == "invalid_input":
            where = f" at {safe_text(r.error_field)}" if r.error_field else ""
            err(
                f"item {safe_text(r.id)}: the candidate refused its input{where}: "
                f"{safe_text(r.error_message)}"
            )
    scoring = rep.Scoring(
        output_schema=contract,
        validator_schema=validator_schema,
        compare=compare,
    )
    meta = {
        "workflow_id": workflow_id,
        "dataset": dataset.path,
        "dataset_sha256": dataset.sha256,
        "candidate": candidate_label(cand),
        "bootstrap": {"n": rep.BOOTSTRAP_N, "seed": rep.BOOTSTRAP_SEED, "level": 0.95},
        "compare": {k: f"{v.name}:{v.threshold:g}" for k, v in sorted(compare.items())},
        "spent_usd": result.spent_usd,
    }
    thresholds = rep.Thresholds(args.max_pass_drop, args.max_cost_rise)
    report = rep.build_report(dataset.items, result.items, scoring, thresholds, meta)
    text = rep.markdown(report)
    if args.report:
        _write(Path(args.report), (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
    if args.markdown:
        _write(Path(args.markdown), text.encode())
    sys.stdout.write(text)
    return EXIT_OK if report["gate"]["passed"] else EXIT_FAILED


async def eval_show(args: argparse.Namespace) -> int:
    """``aiworker eval show REPORT ITEM_ID``: one item of a report, as JSON."""
    from aiworker.schemas.errors import ErrorCode
    from aiworker.workers.evals.run import EvalError

    try:
        report = json.loads(_read(args.report))
    except FileNotFoundError:
        raise EvalError(
            f"no report file {args.report}", ErrorCode.NOT_FOUND, exit_code=EXIT_NOT_FOUND
        ) from None
    except (OSError, ValueError) as e:
        raise EvalError(f"cannot read report {args.report}: {e}") from None
    items = report.get("items") if isinstance(report, dict) else None
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and item.get("id") == args.item_id:
            print(json.dumps(item, indent=2, sort_keys=True))
            return EXIT_OK
    raise EvalError(
        f"report {args.report} has no item {args.item_id!r}",
        ErrorCode.NOT_FOUND,
        exit_code=EXIT_NOT_FOUND,
    )


__all__ = ["add_eval_commands", "cmd_eval"]
