"""The process side moved into subpackages by role; old module paths still
import, with a DeprecationWarning that names the new one."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from aiworker.workers import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_moved_module_exists_at_its_new_path(old: str) -> None:
    importlib.import_module(f"aiworker.workers.{MOVED[old]}")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    # a fresh interpreter: in this one the old names may already be cached
    return subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_an_old_module_path_warns_and_is_the_new_module() -> None:
    out = _run(
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    from aiworker.workers.temporal_client import data_converter as old\n"
        "    import aiworker.workers.schedule_specs as specs\n"
        "from aiworker.workers.client.temporal_client import data_converter\n"
        "import aiworker.workers.schedules.specs as new_specs\n"
        "assert old is data_converter and specs is new_specs\n"
        "print(*sorted(str(w.message).split(';')[0] for w in seen), sep='|')\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().split("|") == [
        "aiworker.workers.schedule_specs moved to aiworker.workers.schedules.specs",
        "aiworker.workers.temporal_client moved to aiworker.workers.client.temporal_client",
    ]


def test_a_name_of_a_module_that_became_a_package_warns() -> None:
    out = _run("from aiworker.workers.conformance import check_worker")
    assert out.returncode != 0
    assert "aiworker.workers.conformance.check_worker moved to" in out.stderr
    assert "aiworker.workers.conformance.run.check_worker" in out.stderr
    # a submodule of the package is imported, never forwarded
    ok = _run("from aiworker.workers.cli import main; print(main.__name__)")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "aiworker.workers.cli.main"


def test_an_unknown_name_is_an_attribute_error() -> None:
    out = _run("from aiworker.workers.schedules import no_such_name")
    assert "ImportError" in out.stderr and "no_such_name" in out.stderr
