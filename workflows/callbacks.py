"""The ``wait`` step's desk: its tokens and the ``callback`` Update (``wait_step`` runs it).

    preflight (dependencies, ``when``) -> tokens (the ``callback-tokens`` local
    activity: one per item of a for_each) -> ``waiting`` until every token is
    completed, failed, or past its deadline (a heartbeat moves the deadline)

Why a token is not a Temporal task token or an activity: the wait lives in the
pipeline's own workflow, so nothing polls and no worker slot is held for hours;
the token carries the workflow id (the front door finds the run without any
side database) and a secret that only the history holds. Its secret comes from
a local activity (:mod:`secrets` outside the sandbox, recorded in the history),
never from ``workflow.random()``, whose seed is not a secret.

:class:`CallbackDesk` is the state the ``callback`` Update works on. Its
validator (:meth:`CallbackDesk.check`) refuses, before anything is written to
the history, an unknown or foreign token, an ended wait, a repeat (the same
answer again: refused with type ``callback_repeat`` carrying the first reply,
which callers answer as a success), another answer after the first (409), a body
off the schema naming the field, and heartbeats past the run's allowance. The
``callback`` query answers what became of a token after the run ended (an
ended workflow takes no Update). Deterministic code only.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from aiworker.schemas import safe_schema
    from aiworker.schemas.callbacks import (
        MAX_HEARTBEATS_PER_RUN,
        CallbackRequest,
        Refusal,
        TokenGrant,
        callback_url,
        make_token,
        parse_token,
    )
    from aiworker.schemas.pipeline import Step

SlotState = Literal["waiting", "completed", "failed", "timed_out", "ended"]


@dataclass
class Slot:
    """One token: which step (and item) it belongs to and where it stands."""

    step_id: str
    index: int | None
    schema: Any
    timeout_seconds: float
    deadline: float  # POSIX seconds, workflow time
    state: SlotState = "waiting"
    answer: str | None = None  # CallbackRequest.answer() of the accepted completion
    outputs: Any = None
    message: str | None = None
    reply: dict[str, Any] | None = None
    heartbeats: int = 0

    def view(self) -> dict[str, Any]:
        """What ``progress`` and the ``callback`` query show of it (never the token)."""
        out: dict[str, Any] = {"step": self.step_id, "state": self.state}
        if self.index is not None:
            out["item"] = self.index
        if self.state == "waiting":
            out["timeout_at"] = _iso(self.deadline)
        return out


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")


def now() -> float:
    """Workflow time as POSIX seconds."""
    return workflow.now().timestamp()


def _refuse(kind: Refusal, message: str, *details: Any) -> ApplicationError:
    return ApplicationError(message, *details, type=kind.value, non_retryable=True)


@dataclass
class CallbackDesk:
    """Every token of the run (by secret) and what each wait step handed out."""

    slots: dict[str, Slot] = field(default_factory=dict)
    # step id -> [(token, callback_url)] in item order
    issued: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # for_each wait steps: their token fields resolve to lists
    listed: set[str] = field(default_factory=set)
    heartbeats: int = 0

    # -- the Update -----------------------------------------------------------

    def _slot(self, token: str) -> tuple[str, Slot]:
        try:
            wid, secret = parse_token(token)
        except ValueError:
            raise _refuse(Refusal.UNKNOWN, "unknown callback token") from None
        slot = self.slots.get(secret)
        if slot is None or wid != workflow.info().workflow_id:
            raise _refuse(Refusal.UNKNOWN, "unknown callback token")
        return secret, slot

    def check(self, raw: Any) -> None:
        """The Update's validator: raise to refuse before the history records anything."""
        try:
            req = CallbackRequest.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise _refuse(Refusal.INVALID, f"invalid callback: {where}: {first['msg']}") from None
        _, slot = self._slot(req.token)
        if slot.answer is not None:
            if req.action != "heartbeat" and req.answer() == slot.answer:
                raise _refuse(Refusal.REPEAT, "the same answer again", slot.reply)
            other = "nothing to extend" if req.action == "heartbeat" else "with another answer"
            raise _refuse(
                Refusal.CONFLICT,
                f"step {slot.step_id!r}: the token was already {slot.state}, {other}",
            )
        if slot.state != "waiting":
            ended = "timed out" if slot.state == "timed_out" else "ended without an answer"
            raise _refuse(Refusal.ENDED, f"step {slot.step_id!r}: the wait {ended}")
        if req.action == "heartbeat":
            if self.heartbeats >= MAX_HEARTBEATS_PER_RUN:
                raise _refuse(
                    Refusal.TOO_MANY,
                    f"this run took its {MAX_HEARTBEATS_PER_RUN} heartbeats; complete or "
                    "fail the token",
                )
            return
        if req.action == "fail":
            if not req.message:
                raise _refuse(Refusal.INVALID, "invalid callback: error.message is required")
            return
        if req.outputs is None:
            raise _refuse(Refusal.INVALID, "invalid callback: outputs is required")
        found = safe_schema.errors(safe_schema.cached_validator(slot.schema), req.outputs)
        if found:
            worst = min(found, key=lambda e: list(map(str, e.absolute_path)))
            path = "outputs" + "".join(f"[{p!r}]" for p in worst.absolute_path)
            raise _refuse(
                Refusal.INVALID,
                f"step {slot.step_id!r}: {path} fails wait.schema: {worst.message}",
                {"field": path},
            )

    def accept(self, raw: Any) -> dict[str, Any]:
        """Record a checked request; the Update's reply."""
        req = CallbackRequest.model_validate(raw)
        try:
            _, slot = self._slot(req.token)
        except ApplicationError as e:  # checked in the validator; kept safe on replay
            return {"status": "refused", "message": e.message}
        reply: dict[str, Any] = {"step": slot.step_id}
        if slot.index is not None:
            reply["item"] = slot.index
        if slot.state != "waiting":  # raced with its timeout in the same task
            return {**reply, "status": slot.state}
        if req.action == "heartbeat":
            self.heartbeats += 1
            slot.heartbeats += 1
            extend = req.extend_seconds or slot.timeout_seconds
            slot.deadline = max(slot.deadline, now() + extend)
            return {**reply, "status": "waiting", "timeout_at": _iso(slot.deadline)}
        slot.answer = req.answer()
        if req.action == "complete":
            slot.state, slot.outputs = "completed", req.outputs
        else:
            slot.state, slot.message = "failed", req.message
        slot.reply = {**reply, "status": slot.state}
        return slot.reply

    def lookup(self, token: str) -> dict[str, Any]:
        """The ``callback`` query: what became of ``token`` (``known`` false: not ours)."""
        try:
            wid, secret = parse_token(token)
        except ValueError:
            return {"known": False}
        slot = self.slots.get(secret)
        if slot is None or wid != workflow.info().workflow_id:
            return {"known": False}
        return {"known": True, **slot.view(), "answer": slot.answer, "reply": slot.reply}

    # -- the step -------------------------------------------------------------

    def open(self, step: Step, grant: TokenGrant, listed: bool) -> list[Slot]:
        """The slots of ``step``'s tokens, waiting from now."""
        assert_wait = step.wait
        if assert_wait is None:  # run_wait is only called for wait steps
            return []
        wid = workflow.info().workflow_id
        start = now()
        out, issued = [], []
        for i, secret in enumerate(grant.secrets):
            slot = Slot(
                step_id=step.id,
                index=i if listed else None,
                schema=assert_wait.schema_,
                timeout_seconds=assert_wait.timeout_seconds,
                deadline=start + assert_wait.timeout_seconds,
            )
            self.slots[secret] = slot
            token = make_token(wid, secret)
            issued.append((token, callback_url(grant.base_url, token)))
            out.append(slot)
        self.issued[step.id] = issued
        if listed:
            self.listed.add(step.id)
        return out

    @staticmethod
    def reopen(slot: Slot) -> None:
        """A reviewer's ``retry``: the token waits again, for its timeout from now."""
        slot.state, slot.answer, slot.outputs, slot.message, slot.reply = (
            "waiting",
            None,
            None,
            None,
            None,
        )
        slot.deadline = now() + slot.timeout_seconds

    def scope_of(self, step_id: str) -> dict[str, Any]:
        """``token`` and ``callback_url`` of a wait step for references (lists for a
        for_each); nothing before its tokens exist."""
        issued = self.issued.get(step_id)
        if issued is None:
            return {}
        if step_id in self.listed:
            return {"token": [t for t, _ in issued], "callback_url": [u for _, u in issued]}
        token, url = issued[0]
        return {"token": token, "callback_url": url}

    def waiting(self) -> list[dict[str, Any]]:
        """Every token still waiting, for ``progress`` (step, item, timeout_at)."""
        return [s.view() for s in self.slots.values() if s.state == "waiting"]

    @staticmethod
    async def wait_all(slots: list[Slot], label: str) -> None:
        """Until every slot is answered or past its deadline. Each round ends one of
        ``slots`` or takes a heartbeat of one (both counted), so the loop is bounded."""
        try:
            for _ in range(len(slots) + MAX_HEARTBEATS_PER_RUN + 1):
                t = now()
                for s in slots:
                    if s.state == "waiting" and s.deadline <= t + 0.001:
                        s.state = "timed_out"
                open_ = [s for s in slots if s.state == "waiting"]
                if not open_:
                    return
                remaining = min(s.deadline for s in open_) - t
                seen = _events(slots)
                try:
                    await workflow.wait_condition(
                        lambda: _events(slots) != seen,  # noqa: B023 - read at once
                        timeout=timedelta(seconds=max(remaining, 0.001)),
                        timeout_summary=f"callback deadline of {label}",
                    )
                except TimeoutError:
                    pass
        finally:
            for s in slots:
                if s.state == "waiting":
                    s.state = "ended"


def _events(slots: list[Slot]) -> int:
    """What happened to ``slots`` so far: answers plus heartbeats."""
    return sum(s.heartbeats + (s.answer is not None) for s in slots)
