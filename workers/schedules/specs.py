"""When a schedule runs, written and read back: the options of ``aiworker schedule
create`` and the one-line text ``list`` and ``describe`` show.

Durations are written as ``temporal`` writes them (``90s``, ``1h30m``,
``500ms``; ``d`` for days), intervals as ``EVERY[/OFFSET]`` (``6h/5h``: every
six hours, five hours past), overlap policies by their ``temporal`` and UI
names (``Skip``, ``BufferOne``, ..., in any case). Temporal keeps a ``--cron``
line as a calendar; :func:`calendar_text` reads it back as the cron line it
stands for, so a schedule edited in the UI reads the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleCalendarSpec,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleSpec,
    ScheduleState,
)

# The overlap policies by the names `temporal schedule` and the UI give them.
OVERLAP_NAMES: Final = {
    ScheduleOverlapPolicy.SKIP: "Skip",
    ScheduleOverlapPolicy.BUFFER_ONE: "BufferOne",
    ScheduleOverlapPolicy.BUFFER_ALL: "BufferAll",
    ScheduleOverlapPolicy.CANCEL_OTHER: "CancelOther",
    ScheduleOverlapPolicy.TERMINATE_OTHER: "TerminateOther",
    ScheduleOverlapPolicy.ALLOW_ALL: "AllowAll",
}
_OVERLAP_BY_KEY: Final = {n.lower(): p for p, n in OVERLAP_NAMES.items()}

_UNIT_SECONDS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_PART: Final = r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h|d)"


class ScheduleSpecError(ValueError):
    """Temporal (or the options themselves) refused when a schedule runs.

    Attributes:
        flag: the ``aiworker schedule create`` flag at fault (``--cron``, ...).
    """

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


def parse_duration(text: str) -> timedelta:
    """A duration as ``temporal`` writes it: ``90s``, ``1h30m``, ``500ms``, ``2d``, ``0``.

    Raises:
        ValueError: not such a duration (the message shows the form).
    """
    value = text.strip()
    if value == "0":
        return timedelta(0)
    if not value or re.fullmatch(f"(?:{_PART})+", value) is None:
        raise ValueError(f"{text!r} is not a duration like 90s, 15m, 1h30m or 500ms")
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in re.findall(_PART, value))
    return timedelta(seconds=seconds)


def parse_interval(text: str) -> ScheduleIntervalSpec:
    """``EVERY[/OFFSET]`` (``45m``, ``6h/5h``: every 6 hours, 5 hours past the epoch's).

    Raises:
        ValueError: not an interval, or an interval of zero.
    """
    every, _, offset = text.partition("/")
    spec = ScheduleIntervalSpec(
        every=parse_duration(every), offset=parse_duration(offset) if offset else None
    )
    if spec.every <= timedelta(0):
        raise ValueError(f"{text!r}: the interval must be longer than 0s")
    return spec


def overlap_policy(name: str) -> ScheduleOverlapPolicy:
    """An overlap policy by its ``temporal`` name, in any case (``skip``, ``BufferOne``).

    Raises:
        ValueError: no such policy (the message lists them).
    """
    policy = _OVERLAP_BY_KEY.get(name.replace("-", "").replace("_", "").lower())
    if policy is None:
        raise ValueError(f"{name!r} is not one of {', '.join(OVERLAP_NAMES.values())}")
    return policy


def format_duration(value: timedelta) -> str:
    """A duration as ``temporal`` writes it: ``1h30m``, ``2s``, ``500ms``, ``0s``."""
    ms = round(value.total_seconds() * 1000)
    if ms % 1000:
        return f"{ms}ms" if ms < 1000 else f"{ms / 1000:g}s"
    rest, out = ms // 1000, ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out + f"{rest}s" if rest or not out else out


def _field(ranges: Sequence[ScheduleRange], low: int, high: int, default: str) -> str:
    """One field of a cron line from a calendar's ranges (end and step default as
    Temporal's do: to the start and to 1)."""
    if not ranges:
        return default
    out = []
    for r in ranges:
        end, step = max(r.end, r.start), r.step or 1
        text = "*" if (r.start, end) == (low, high) else str(r.start)
        if text != "*" and end != r.start:
            text += f"-{end}"
        out.append(text + (f"/{step}" if step != 1 else ""))
    return ",".join(out)


def calendar_text(cal: ScheduleCalendarSpec) -> str:
    """A calendar as the cron line it reads as (Temporal keeps ``--cron`` strings as
    calendars); with seconds first when it fires at another second than 0."""
    if cal.comment:
        return cal.comment
    fields = [
        _field(cal.minute, 0, 59, "0"),
        _field(cal.hour, 0, 23, "0"),
        _field(cal.day_of_month, 1, 31, "*"),
        _field(cal.month, 1, 12, "*"),
        _field(cal.day_of_week, 0, 6, "*"),
    ]
    second = _field(cal.second, 0, 59, "0")
    text = " ".join(fields if second == "0" else [second, *fields])
    return text + (f" year {_field(cal.year, 0, 9999, '*')}" if cal.year else "")


def interval_text(spec: ScheduleIntervalSpec) -> str:
    """``every 2s`` or ``every 6h/5h``, the ``--interval`` it was written as."""
    offset = f"/{format_duration(spec.offset)}" if spec.offset else ""
    return f"every {format_duration(spec.every)}{offset}"


def spec_text(spec: ScheduleSpec) -> str:
    """When a schedule runs, in one line: ``cron 0 2 * * * (Europe/Berlin)``, ``every 2s``."""
    parts = [
        *(f"cron {c}" for c in spec.cron_expressions),
        *(f"cron {calendar_text(c)}" for c in spec.calendars),
        *(interval_text(i) for i in spec.intervals),
    ]
    text = "; ".join(parts) or "no times"
    if spec.time_zone_name:
        text += f" ({spec.time_zone_name})"
    if spec.jitter:
        text += f", jitter {format_duration(spec.jitter)}"
    return text


@dataclass(frozen=True)
class ScheduleOptions:
    """When and how a schedule starts its pipeline (``aiworker schedule create``'s flags).

    Attributes:
        cron: cron lines (``30 2 * * *``, ``@daily``), each a time to run.
        intervals: intervals to run at (:func:`parse_interval`).
        time_zone: the IANA zone the cron lines are in (default UTC).
        jitter: each run starts up to this much later, at random.
        catchup_window: how late a run missed while the server was down may
            still start (Temporal's default: a year).
        overlap: what a run due while the last still runs does (default skip it).
        pause_on_failure: pause the schedule when a run's workflow fails (a
            pipeline that ends ``failed``, ``rejected``, ``escalation_timed_out``
            or ``budget_exhausted`` fails its workflow; ``partial`` does not).
        note: the schedule's note, shown by ``describe`` and the UI.
        paused: create it paused.
    """

    cron: Sequence[str] = ()
    intervals: Sequence[ScheduleIntervalSpec] = ()
    time_zone: str | None = None
    jitter: timedelta | None = None
    catchup_window: timedelta | None = None
    overlap: ScheduleOverlapPolicy = ScheduleOverlapPolicy.SKIP
    pause_on_failure: bool = False
    note: str | None = None
    paused: bool = False

    def schedule(self, action: ScheduleActionStartWorkflow) -> Schedule:
        """The Temporal schedule that takes ``action`` at these times."""
        return Schedule(
            action=action,
            spec=ScheduleSpec(
                cron_expressions=list(self.cron),
                intervals=list(self.intervals),
                time_zone_name=self.time_zone,
                jitter=self.jitter,
            ),
            policy=SchedulePolicy(
                overlap=self.overlap,
                catchup_window=self.catchup_window,
                pause_on_failure=self.pause_on_failure,
            ),
            state=ScheduleState(note=self.note, paused=self.paused),
        )
