"""An eval run from the client's side: the candidate from the command line, the
``EvalWorkflow`` started (or found again), the report built from its result.

The workflow's id is ``eval-<dataset hash>-<candidate hash>`` (12 hex digits
each): the same dataset and candidate name the same run, so a command started
again after a crash (of the command or of a worker process) attaches to the run
that is still going instead of calling every item again
(``WorkflowIDConflictPolicy.USE_EXISTING``); once that run has ended, the same
command starts a new one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.evals import EvalCandidate, EvalInput, EvalItem, EvalJudge, EvalResult
from aiworker.schemas.spec import PromptImplementation, WorkerSpec, describe_validation
from aiworker.workers.evals.dataset import Dataset, canonical


class EvalError(Exception):
    """An eval that cannot run as asked: ``code`` is its stable error code,
    ``exit_code`` the command's (2 bad usage; 3 when a selection matched nothing)."""

    def __init__(
        self, message: str, code: ErrorCode = ErrorCode.INVALID_INPUT, *, exit_code: int = 2
    ) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


@dataclass(frozen=True)
class CandidateChoice:
    """What the command line names: exactly one of the three."""

    spec_file: str | None = None
    model: str | None = None
    task_queue: str | None = None
    allow_side_effects: bool = False


def dataset_worker(dataset: Dataset) -> str | None:
    """The one worker the dataset's items recorded (None: none says).

    Raises:
        EvalError: items of more than one worker.
    """
    workers = {i.worker for i in dataset.items if i.worker}
    if len(workers) > 1:
        raise EvalError(
            f"{dataset.path}: items of several workers ({', '.join(sorted(workers))}): "
            "an eval compares one worker's calls"
        )
    return next(iter(workers), None)


def read_spec_file(path: str) -> WorkerSpec:
    """A candidate's spec file, checked; ``EvalError`` names the file and field."""
    if not Path(path).is_file():
        raise EvalError(f"no candidate spec file {path}", ErrorCode.NOT_FOUND)
    try:
        return WorkerSpec.from_file(path)
    except (ValueError, OSError) as e:
        raise EvalError(f"invalid candidate spec: {e}") from None


def read_judge_file(path: str) -> EvalJudge:
    """A judge file (``model``, ``rubric``, ``response_schema``, ``pass_field``)."""
    try:
        raw = json.loads(Path(path).read_text("utf-8"))
    except FileNotFoundError:
        raise EvalError(f"no judge file {path}", ErrorCode.NOT_FOUND) from None
    except (OSError, ValueError) as e:
        raise EvalError(f"invalid judge file {path}: {e}") from None
    try:
        judge = EvalJudge.model_validate(raw)
    except ValidationError as e:
        raise EvalError(f"invalid judge file {path}: {describe_validation(e)}") from None
    props = judge.response_schema.get("properties")
    field = props.get(judge.pass_field) if isinstance(props, dict) else None
    if not (isinstance(field, dict) and field.get("type") == "boolean"):
        raise EvalError(
            f"invalid judge file {path}: response_schema.properties.{judge.pass_field} "
            'must be {"type": "boolean"} (the judge\'s verdict)'
        )
    return judge


def choose_candidate(
    choice: CandidateChoice,
    worker: str | None,
    specs: Mapping[str, WorkerSpec],
    aliases: set[str] | None,
) -> EvalCandidate:
    """The candidate the command line names, checked against the known workers.

    Raises:
        EvalError: an invalid or unknown spec, a model alias nobody configures,
            a worker kind the choice cannot run, a worker with side effects.
    """
    named = [x for x in (choice.spec_file, choice.model, choice.task_queue) if x]
    if len(named) != 1:
        raise EvalError(
            "name one candidate: --candidate SPEC_FILE, --model ALIAS or --task-queue Q"
        )
    recorded = specs.get(worker) if worker else None
    if worker and recorded is None and not choice.spec_file:
        raise EvalError(
            f"unknown worker {worker!r} (the dataset's): the known workers are "
            f"{', '.join(sorted(specs))}",
            ErrorCode.NOT_FOUND,
        )
    if choice.spec_file:
        spec = read_spec_file(choice.spec_file)
        if not isinstance(spec.implementation, PromptImplementation):
            raise EvalError(
                f"invalid candidate spec: {choice.spec_file} is a {spec.kind} worker; "
                "--candidate takes a prompt worker's spec (serve another kind and name "
                "its queue with --task-queue)"
            )
        _check_alias(spec.implementation.model, aliases)
        cand = EvalCandidate(mode="spec", spec=spec)
    elif choice.model:
        if recorded is None:
            raise EvalError("--model needs a dataset whose items name their worker")
        _check_alias(choice.model, aliases)
        if isinstance(recorded.implementation, PromptImplementation):
            impl = recorded.implementation.model_copy(update={"model": choice.model})
            cand = EvalCandidate(
                mode="spec", spec=recorded.model_copy(update={"implementation": impl})
            )
        elif recorded.worker_id == names.LLM_CALL:
            cand = EvalCandidate(
                mode="queue", spec=recorded, input_overrides={"model": choice.model}
            )
        else:
            raise EvalError(
                f"--model: worker {recorded.worker_id!r} is a {recorded.kind} worker with no "
                "model alias to change (prompt workers and llm-call have one)"
            )
    else:
        if recorded is None:
            raise EvalError("--task-queue needs a dataset whose items name their worker")
        cand = EvalCandidate(mode="queue", spec=recorded, task_queue=choice.task_queue)
    side_effects = cand.spec.side_effects or (recorded is not None and recorded.side_effects)
    if side_effects:
        if not choice.allow_side_effects:
            raise EvalError(
                f"worker {cand.spec.worker_id!r} has side effects (it changes the world): an "
                "eval refuses it unless --allow-side-effects, and then calls it only on a "
                "--task-queue other than its own (a sandbox deployment)",
                ErrorCode.ACCESS_DENIED,
            )
        if cand.mode != "queue" or not cand.task_queue or cand.task_queue == cand.spec.task_queue:
            raise EvalError(
                f"worker {cand.spec.worker_id!r} has side effects: an eval never calls it on "
                f"its own queue {cand.spec.task_queue!r}; name a sandbox with --task-queue",
                ErrorCode.ACCESS_DENIED,
            )
    return cand


def _check_alias(alias: str, aliases: set[str] | None) -> None:
    if aliases is not None and alias not in aliases:
        raise EvalError(
            f"unknown model alias {alias!r}: the configured ones are {', '.join(sorted(aliases))}",
            ErrorCode.NOT_FOUND,
        )


def candidate_label(cand: EvalCandidate) -> str:
    """How the report names the candidate."""
    spec = cand.spec
    label = f"{spec.worker_id}@{spec.version}"
    if cand.mode == "queue" and cand.task_queue:
        label += f" on {cand.task_queue}"
    if isinstance(spec.implementation, PromptImplementation):
        label += f" ({spec.implementation.model})"
    if cand.input_overrides.get("model"):
        label += f" ({cand.input_overrides['model']})"
    return label


def eval_workflow_id(dataset: Dataset, inp: EvalInput) -> str:
    """``eval-<dataset hash>-<candidate hash>``: the same eval names the same run."""
    body = inp.model_dump(mode="json", exclude={"items", "dataset_sha256"})
    digest = hashlib.sha256(canonical(body).encode()).hexdigest()
    return f"eval-{dataset.sha256[:12]}-{digest[:12]}"


def eval_input(
    dataset: Dataset,
    cand: EvalCandidate,
    settings: Settings,
    *,
    judge: EvalJudge | None = None,
    judge_spec: WorkerSpec | None = None,
    max_cost_usd: float | None = None,
    concurrency: int = 4,
) -> EvalInput:
    """The workflow's input: every item of ``dataset`` for ``cand``."""
    return EvalInput(
        dataset_sha256=dataset.sha256,
        items=[EvalItem(id=i.id, input=i.input, tenant=i.tenant) for i in dataset.items],
        candidate=cand,
        judge=judge,
        judge_spec=judge_spec,
        max_cost_usd=max_cost_usd,
        concurrency=concurrency,
        queue_suffix=settings.task_queue_suffix,
    )


async def start_eval(
    client: Client, settings: Settings, workflow_id: str, inp: EvalInput
) -> WorkflowHandle[Any, EvalResult]:
    """Start the eval's workflow, or attach to it while it runs."""
    return await client.start_workflow(
        names.EVAL_WORKFLOW,
        inp,
        id=workflow_id,
        task_queue=settings.queue(names.PIPELINES_QUEUE),
        result_type=EvalResult,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"eval of {candidate_label(inp.candidate)} on {len(inp.items)} items",
    )


__all__ = [
    "CandidateChoice",
    "EvalError",
    "candidate_label",
    "choose_candidate",
    "dataset_worker",
    "eval_input",
    "eval_workflow_id",
    "read_judge_file",
    "read_spec_file",
    "start_eval",
]
