"""Every flag of ``aiworker dev``, ``serve`` and ``worker`` says what it does, in
``--help`` and in a row of docs/cli.md ("Flags of `dev`, `serve` and `worker`")."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from aiworker.workers.cli.parser import build_parser

COMMANDS = ("dev", "serve", "worker")
CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _command(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def _flags(name: str) -> list[argparse.Action]:
    return [
        a
        for a in _command(name)._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]


def _doc_section(name: str) -> str:
    text = CLI_DOC.read_text(encoding="utf-8")
    start = text.index(f"### `aiworker {name}`")
    end = re.search(r"^##", text[start + 3 :], re.MULTILINE)
    return text[start : start + 3 + end.start()] if end else text[start:]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_flag_has_help(name: str) -> None:
    flags = _flags(name)
    assert flags, name
    missing = [a.option_strings for a in flags if not a.help or a.help == argparse.SUPPRESS]
    assert missing == [], f"aiworker {name}: flags without help: {missing}"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_flag_has_a_docs_row(name: str) -> None:
    rows = [line for line in _doc_section(name).splitlines() if line.startswith("| `")]
    missing = [
        flag
        for a in _flags(name)
        for flag in a.option_strings
        if not any(re.search(rf"`{re.escape(flag)}[` ]", row.split("|")[1]) for row in rows)
    ]
    assert missing == [], f"docs/cli.md has no row for aiworker {name} {missing}"


def test_dev_help_describes_its_ports() -> None:
    text = _command("dev").format_help()
    assert "the Temporal server's gRPC port" in text and "the Temporal Web UI's port" in text
    assert "--site [PORT]" in text
