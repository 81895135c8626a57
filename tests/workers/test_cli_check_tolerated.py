"""``aiworker check`` on a for_each step's ``tolerated_failures`` (issue #34), in a
real process: each bad value is named with its step and field and exits 2; a valid
value passes, and a share of the items is rounded down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_cli_check import cli, write

from aiworker.schemas.pipeline_check import tolerated_count


def _pipeline(tolerated: Any, for_each: Any = ("a", "b")) -> dict[str, Any]:
    step: dict[str, Any] = {
        "id": "each",
        "worker": "validator",
        "input": {"data": {"n": 1}, "schema": {"type": "object"}},
        "tolerated_failures": tolerated,
    }
    if for_each is not None:
        step["for_each"] = list(for_each)
    return {"name": "tolerate", "steps": [step]}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "must be >= 0, got -1"),
        ("101%", "a share cannot exceed 100%, got '101%'"),
        ("100.5%", "a share cannot exceed 100%, got '100.5%'"),
        ("ten%", "must be an integer >= 0 or a string \"N%\" (0-100), got 'ten%'"),
        ("-5%", "must be an integer >= 0 or a string \"N%\" (0-100), got '-5%'"),
        ("5", "must be an integer >= 0 or a string \"N%\" (0-100), got '5'"),
    ],
)
def test_a_bad_threshold_names_the_step_and_field(tmp_path: Path, value: Any, message: str) -> None:
    proc = cli(["check", str(f := write(tmp_path, _pipeline(value)))])
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.splitlines() == [f"{f}: step 'each': field 'tolerated_failures': {message}"]


def test_a_threshold_on_a_step_without_for_each_is_refused(tmp_path: Path) -> None:
    proc = cli(["check", str(f := write(tmp_path, _pipeline(3, for_each=None)))])
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.splitlines() == [
        f"{f}: step 'each': field 'tolerated_failures': "
        "only a for_each step takes tolerated_failures"
    ]


def test_a_value_of_the_wrong_type_exits_2(tmp_path: Path) -> None:
    proc = cli(["check", str(write(tmp_path, _pipeline([3])))])
    assert proc.returncode == 2, proc.stderr
    assert "tolerated_failures" in proc.stdout + proc.stderr


@pytest.mark.parametrize("value", [0, 3, "0%", "25%", "12.5%", "100%"])
def test_a_valid_threshold_passes(tmp_path: Path, value: Any) -> None:
    proc = cli(["check", str(write(tmp_path, _pipeline(value)))])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_threshold_with_items_per_task_is_refused(tmp_path: Path) -> None:
    pipeline = _pipeline(2)
    pipeline["steps"][0]["items_per_task"] = 5
    proc = cli(["check", str(f := write(tmp_path, pipeline))])
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.splitlines() == [
        f"{f}: step 'each': field 'tolerated_failures': is not supported with "
        "items_per_task > 1 (a task's items cannot be stopped one by one): drop one of them"
    ]


@pytest.mark.parametrize(
    ("value", "total", "tolerated"),
    [
        (3, 20, 3),
        ("0%", 20, 0),
        ("10%", 20, 2),
        ("12.5%", 20, 2),
        ("12.5%", 7, 0),
        ("33.3%", 10, 3),
        ("100%", 20, 20),
        ("9.99%", 100, 9),
    ],
)
def test_a_share_is_rounded_down(value: Any, total: int, tolerated: int) -> None:
    assert tolerated_count(value, total) == tolerated
