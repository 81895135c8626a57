"""``aiworker worker`` with a hold after each ``publish``.

Run as a subprocess by the kill/restart test::

    python standin_worker.py --attempts A --hold SECONDS

It swaps one line of the activity registry and then runs the very code path
of the ``aiworker worker`` command (``workers.cli.run_main`` with ``worker``:
settings from the environment, search attributes, ``build_workers``,
``run_until_stopped``), so the process under test is the real worker
process apart from that one activity.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.standins import SlowPublish, registered

from aiworker.workers.cli import run_main


def run() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--attempts", required=True, type=Path)
    p.add_argument("--hold", required=True, type=float)
    args = p.parse_args()
    worker = SlowPublish(args.attempts, args.hold)
    # The console script's own entry, so the process exits as `aiworker worker` does.
    sys.argv = [sys.argv[0], "worker"]
    with registered(worker):
        run_main()


if __name__ == "__main__":
    run()
