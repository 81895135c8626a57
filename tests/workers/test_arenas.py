"""A worker process bounds glibc's malloc arenas (issue 17): the
``AIWORKER_MALLOC_ARENAS`` setting parses, bad values stop the process naming
it, and the bound takes effect (threads share the arenas instead of one each),
while an explicit ``MALLOC_ARENA_MAX`` is left to glibc. No memory figures are
asserted here; those are ``bench.foreach``'s."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest
from support.procs import run_cli_module

from aiworker.config.settings import Settings, SettingsError
from aiworker.workers.devstack.arenas import bound_malloc_arenas

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's arenas")

# Threads that each allocate (objects above pymalloc's 512 bytes go to malloc),
# held at a barrier so none can hand its arena to the next; then glibc's own
# report (malloc_info's XML, one <heap nr=...> per arena) is counted.
COUNT_ARENAS = textwrap.dedent(
    """
    import ctypes, os, sys, tempfile, threading
    from aiworker.workers.devstack.arenas import bound_malloc_arenas
    print("set", bound_malloc_arenas(int(sys.argv[1])))
    barrier = threading.Barrier(16)
    keep = []
    def work():
        keep.append([bytearray(4096) for _ in range(50)])
        barrier.wait()
    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads: t.start()
    for t in threads: t.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    path = os.path.join(tempfile.mkdtemp(), "info.xml")
    fp = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print("arenas", open(path).read().count("<heap nr="))
    """
)


def arenas_in_child(arenas: int, **env: str) -> tuple[str, int]:
    """(what bound_malloc_arenas returned, arenas glibc reports) in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, str(arenas)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split("\n")
    return out[0].removeprefix("set "), int(out[1].removeprefix("arenas "))


def test_setting_defaults_to_two_and_parses() -> None:
    assert Settings.from_env({}).malloc_arenas == 2
    assert Settings.from_env({"AIWORKER_MALLOC_ARENAS": "4"}).malloc_arenas == 4
    assert Settings.from_env({"AIWORKER_MALLOC_ARENAS": "0"}).malloc_arenas == 0


@pytest.mark.parametrize("bad", ["two", "-1", "1.5", "100000"])
def test_bad_values_are_refused_naming_the_setting(bad: str) -> None:
    with pytest.raises(SettingsError, match="AIWORKER_MALLOC_ARENAS"):
        Settings.from_env({"AIWORKER_MALLOC_ARENAS": bad})


def test_worker_command_refuses_a_bad_value_with_exit_2() -> None:
    proc = run_cli_module(["worker"], {**os.environ, "AIWORKER_MALLOC_ARENAS": "lots"})
    assert proc.returncode == 2
    assert "AIWORKER_MALLOC_ARENAS" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_zero_and_an_explicit_environment_leave_glibc_alone() -> None:
    assert bound_malloc_arenas(0, {}) is None
    assert bound_malloc_arenas(2, {"MALLOC_ARENA_MAX": "4"}) is None
    assert bound_malloc_arenas(2, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}) is None


@glibc_only
def test_the_bound_holds_for_many_threads() -> None:
    assert arenas_in_child(2) == ("2", 2)
    # without it, 16 threads on any machine with 2+ cores get more than 2 arenas
    set_, unbounded = arenas_in_child(0)
    assert set_ == "None"
    assert unbounded > 2
    # an explicit MALLOC_ARENA_MAX is glibc's to apply, and it does
    assert arenas_in_child(2, MALLOC_ARENA_MAX="3") == ("None", 3)
