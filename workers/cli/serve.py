"""The front door's commands: ``aiworker serve`` and ``aiworker keys add``.

Beside :mod:`aiworker.workers.cli.main` (which lists them in its ``COMMANDS``);
FastAPI and uvicorn load inside ``serve`` only.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from aiworker.workers.cli.common import EXIT_OK, EXIT_USAGE, command_settings, configure_logs, err


async def cmd_serve(args: argparse.Namespace) -> int:
    """``aiworker serve``: the HTTP front door until SIGTERM or Ctrl-C."""
    from aiworker.config.extras import require

    require("serve", "aiworker serve")  # MissingExtraError: one line and exit 2 in `main`
    from aiworker.workers.frontdoor.serve import serve

    settings = command_settings(args)
    overrides = {"serve_host": args.host, "serve_port": args.port}
    settings = settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    configure_logs(settings)

    def listening(host: str, port: int) -> None:
        # One line on stdout a script (or a test) waits for, with the real port.
        print(f"aiworker serve: listening on http://{host}:{port}", flush=True)

    # ServeConfigError (a bad keys or hooks file, no API key): one line and exit 2 in `main`
    await serve(
        settings,
        address=args.address,
        profile=args.profile,
        env=os.environ,
        on_listening=listening,
        without_api_keys=args.without_api_keys,
        on_warning=lambda line: err(f"WARNING: {line}"),
    )
    return EXIT_OK


async def cmd_keys(args: argparse.Namespace) -> int:
    """``aiworker keys add NAME --tenant T``: a new API key, stored hashed, printed once."""
    from aiworker.workers.frontdoor.auth import MIN_KEY_CHARS, add_key, new_key

    path = args.file or os.environ.get("AIWORKER_API_KEYS_FILE")
    if not path:
        err("no keys file: pass --file or set AIWORKER_API_KEYS_FILE")
        return EXIT_USAGE
    key = sys.stdin.readline().strip() if args.stdin else new_key()
    if len(key) < MIN_KEY_CHARS:
        err(f"a key must have at least {MIN_KEY_CHARS} characters (a drawn key has 47)")
        return EXIT_USAGE
    entry = add_key(Path(path), args.name, args.tenant, args.rate_limit, key)
    err(
        f"added key {entry.name!r} for tenant {entry.tenant!r} to {path}; keep it, it is shown once"
    )
    if not args.stdin:
        print(key)
    return EXIT_OK
