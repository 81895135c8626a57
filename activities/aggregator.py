"""The ``aggregator`` worker: merges branch results with an explicit policy.

``branches`` holds the results of parallel steps, by name (an object) or in
order (an array, named by index); ``null`` marks a branch that failed or
produced nothing. Policies:

- ``all``: every branch must be present; the result is the branches as given.
- ``first_success``: the first present branch.
- ``quorum`` / ``majority``: a vote on ``field`` (a dotted path into each
  branch, default the whole value); the winner needs ``quorum`` votes, or
  more than half of all branches.
- ``merge``: object merge; a key on which branches disagree is resolved by
  ``conflict`` (``prefer_first``, ``prefer_majority``) or fails (``error``).
- ``concat``: list concatenation, dropping later items whose ``dedupe_key``
  was already seen.

Every disagreement becomes a warning naming the branches involved, so a
reviewer sees what the merge threw away. A policy that cannot be met fails
with ``validation_failed`` and the reasons.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from aiworker.activities.errors import InvalidInputError, ValidationFailedError
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.config.catalog import builtin_spec
from aiworker.schemas.protocol import WarningInfo

_MISSING = object()


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _dig(value: Any, path: str | None) -> Any:
    """The value at a dotted path (``a.b.0``); ``_MISSING`` when absent."""
    if not path:
        return value
    cur = value
    for seg in path.split("."):
        if isinstance(cur, dict) and seg in cur:
            cur = cur[seg]
        elif isinstance(cur, list) and seg.isascii() and seg.isdigit() and int(seg) < len(cur):
            cur = cur[int(seg)]
        else:
            return _MISSING
    return cur


def _branches(raw: dict[str, Any] | list[Any]) -> list[tuple[str, Any]]:
    if isinstance(raw, dict):
        return list(raw.items())
    return [(str(i), v) for i, v in enumerate(raw)]


class Aggregator(Worker):
    """Merges branch results under one of six explicit policies."""

    spec = builtin_spec("aggregator")

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        policy: str = input["policy"]
        branches = _branches(input["branches"])
        if not branches:
            raise InvalidInputError("branches is empty", field="input.branches")
        present = [(n, v) for n, v in branches if v is not None]
        failed = [n for n, v in branches if v is None]
        warnings = [
            WarningInfo(code="branch_failed", message=f"branch {n!r} has no result", field=n)
            for n in failed
        ]
        out: dict[str, Any] = {"policy": policy, "failed": failed}
        if policy == "all":
            if failed:
                raise ValidationFailedError(
                    f"policy 'all': branch(es) {', '.join(map(repr, failed))} did not succeed",
                    reasons=[{"branch": n, "message": "no result"} for n in failed],
                )
            out.update(result=input["branches"], used=[n for n, _ in present])
        elif policy == "first_success":
            if not present:
                raise ValidationFailedError(
                    "policy 'first_success': no branch succeeded",
                    reasons=[{"branch": n, "message": "no result"} for n in failed],
                )
            name, value = present[0]
            out.update(result=value, used=[name])
        elif policy in ("quorum", "majority"):
            out.update(self._vote(policy, input, branches, present, warnings))
        elif policy == "merge":
            out.update(self._merge(input.get("conflict", "prefer_first"), present, warnings))
        else:
            out.update(self._concat(input, present, warnings))
        status = "partial" if failed and policy != "all" else "succeeded"
        return WorkerResult(
            outputs=out, status=status, warnings=warnings, log_fields={"policy": policy}
        )

    def _vote(
        self,
        policy: str,
        worker_input: dict[str, Any],
        branches: list[tuple[str, Any]],
        present: list[tuple[str, Any]],
        warnings: list[WarningInfo],
    ) -> dict[str, Any]:
        field = worker_input.get("field")
        if policy == "quorum":
            if "quorum" not in worker_input:
                raise InvalidInputError("policy 'quorum' needs 'quorum'", field="input.quorum")
            needed = int(worker_input["quorum"])
        else:
            needed = len(branches) // 2 + 1
        ballots: dict[str, list[str]] = {}
        values: dict[str, Any] = {}
        for name, value in present:
            v = _dig(value, field)
            if v is _MISSING:
                warnings.append(
                    WarningInfo(
                        code="branch_abstained",
                        message=f"branch {name!r} has no field {field!r}",
                        field=name,
                    )
                )
                continue
            key = _canon(v)
            ballots.setdefault(key, []).append(name)
            values[key] = v
        votes = {k: len(v) for k, v in ballots.items()}
        if not votes:
            raise ValidationFailedError(
                f"policy {policy!r}: no branch voted", reasons=[{"message": "no votes"}]
            )
        # Ties go to the value whose first voter comes first: deterministic.
        winner = max(
            ballots, key=lambda k: (votes[k], -min(_order(branches, n) for n in ballots[k]))
        )
        if votes[winner] < needed:
            raise ValidationFailedError(
                f"policy {policy!r}: best value has {votes[winner]} of {needed} needed votes",
                reasons=[
                    {"value": values[k], "branches": ballots[k], "votes": votes[k]} for k in ballots
                ],
            )
        for k, voters in ballots.items():
            if k != winner:
                warnings.append(
                    WarningInfo(
                        code="branch_disagrees",
                        message=(
                            f"branch(es) {', '.join(map(repr, voters))} voted {k}, "
                            f"outvoted by {', '.join(map(repr, ballots[winner]))}"
                        ),
                        field=field,
                    )
                )
        return {"result": values[winner], "used": ballots[winner], "votes": votes}

    def _merge(
        self, conflict: str, present: list[tuple[str, Any]], warnings: list[WarningInfo]
    ) -> dict[str, Any]:
        for name, value in present:
            if not isinstance(value, dict):
                raise InvalidInputError(
                    f"policy 'merge': branch {name!r} is a {type(value).__name__}, not an object",
                    field=f"input.branches.{name}",
                )
        conflicts: list[dict[str, Any]] = []
        result = _merge_objects(present, conflict, "", conflicts)
        if conflicts and conflict == "error":
            raise ValidationFailedError(
                f"policy 'merge': {len(conflicts)} conflicting key(s); first "
                f"{conflicts[0]['key']!r} between {', '.join(conflicts[0]['branches'])}",
                reasons=conflicts,
            )
        for c in conflicts:
            warnings.append(
                WarningInfo(
                    code="merge_conflict",
                    message=(
                        f"key {c['key']!r}: branches {', '.join(map(repr, c['branches']))} "
                        f"disagree; took the value of {c['chosen']!r} ({conflict})"
                    ),
                    field=c["key"],
                )
            )
        return {"result": result, "used": [n for n, _ in present], "conflicts": conflicts}

    def _concat(
        self,
        worker_input: dict[str, Any],
        present: list[tuple[str, Any]],
        warnings: list[WarningInfo],
    ) -> dict[str, Any]:
        field = worker_input.get("field")
        key_path = worker_input.get("dedupe_key")
        result: list[Any] = []
        seen: dict[str, tuple[str, str]] = {}
        removed = 0
        for name, value in present:
            items = _dig(value, field)
            if not isinstance(items, list):
                raise InvalidInputError(
                    f"policy 'concat': branch {name!r}"
                    + (f" field {field!r}" if field else "")
                    + " is not a list",
                    field=f"input.branches.{name}",
                )
            for item in items:
                if key_path:
                    k = _dig(item, key_path)
                    if k is not _MISSING:
                        ck = _canon(k)
                        if ck in seen:
                            removed += 1
                            first_branch, first_item = seen[ck]
                            if first_item != _canon(item):
                                warnings.append(
                                    WarningInfo(
                                        code="duplicate_differs",
                                        message=(
                                            f"{key_path}={ck}: branch {name!r} differs from "
                                            f"branch {first_branch!r}; kept {first_branch!r}"
                                        ),
                                        field=key_path,
                                    )
                                )
                            continue
                        seen[ck] = (name, _canon(item))
                result.append(item)
        return {
            "result": result,
            "used": [n for n, _ in present],
            "duplicates_removed": removed,
        }


def _order(branches: list[tuple[str, Any]], name: str) -> int:
    for i, (n, _) in enumerate(branches):
        if n == name:
            return i
    return len(branches)


def _merge_objects(
    present: list[tuple[str, Any]], conflict: str, prefix: str, conflicts: list[dict[str, Any]]
) -> dict[str, Any]:
    keys: list[str] = []
    for _, value in present:
        for k in value:
            if k not in keys:
                keys.append(k)
    out: dict[str, Any] = {}
    for k in keys:
        having = [(n, v[k]) for n, v in present if k in v]
        path = f"{prefix}{k}"
        if len(having) > 1 and all(isinstance(v, dict) for _, v in having):
            out[k] = _merge_objects(having, conflict, path + ".", conflicts)
            continue
        distinct = {_canon(v) for _, v in having}
        if len(distinct) == 1:
            out[k] = having[0][1]
            continue
        if conflict == "prefer_majority":
            counts = Counter(_canon(v) for _, v in having)
            best = max(counts.values())
            chosen = next(n for n, v in having if counts[_canon(v)] == best)
        else:
            chosen = having[0][0]
        out[k] = next(v for n, v in having if n == chosen)
        conflicts.append(
            {
                "key": path,
                "branches": [n for n, _ in having],
                "values": {n: v for n, v in having},
                "chosen": chosen,
            }
        )
    return out
