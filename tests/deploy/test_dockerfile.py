"""deploy/Dockerfile, read as text (no Docker engine runs in CI): a
multi-stage build whose final stage is slim, non-root, free of build tools,
health-checked with Python and started as ``aiworker worker``.
"""

from __future__ import annotations

import json
import re
import subprocess

from deploy_tools import DEPLOY, ROOT

DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
BUILD_TOOLS = ("build-essential", "gcc", "g++", "make ", "apt-get install", "pip install")


def _stages() -> list[list[str]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_multi_stage_with_a_slim_python_3_11_base() -> None:
    stages = _stages()
    assert len(stages) >= 2
    arg = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert arg and re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", arg.group(1)), arg


def test_final_stage_has_no_build_tools_and_runs_non_root() -> None:
    final = _stages()[-1]
    for line in final:
        if line.startswith("RUN "):
            assert not any(t in line for t in BUILD_TOOLS), line
    copies = [line for line in final if line.startswith("COPY ")]
    assert copies and all("--from=build" in c for c in copies), copies
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"


def test_entrypoint_and_healthcheck() -> None:
    final = _stages()[-1]
    (entry,) = [line for line in final if line.startswith("ENTRYPOINT ")]
    assert json.loads(entry.removeprefix("ENTRYPOINT ")) == ["aiworker", "worker"]
    (health,) = [line for line in final if line.startswith("HEALTHCHECK ")]
    cmd = json.loads(health.split(" CMD ", 1)[1])
    assert cmd[0] == "python" and "curl" not in health
    assert "http://127.0.0.1:9464/healthz" in cmd[-1]
    # The probe's Python runs as written and fails (exit 1) when nothing listens.
    probe = cmd[-1].replace("9464", "9")
    assert subprocess.run(["python3", "-c", probe], capture_output=True, timeout=30).returncode


def test_dockerignore_keeps_the_context_small() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "**" in ignore  # everything out, then the packages back in
    for needed in ("pyproject.toml", "aiworker/", *(f"{p}/" for p in PACKAGE_FOLDERS)):
        assert f"!{needed}" in ignore
    copied = re.findall(r"^COPY (?!--from)(\S+)", DOCKERFILE, re.M)
    for src in copied:
        assert (ROOT / src).exists(), src


# The folders aiworker/ links to: each installs as aiworker.<name>, so an image
# that leaves one out installs a package that cannot import.
PACKAGE_FOLDERS = sorted(p.name for p in (ROOT / "aiworker").iterdir() if p.is_symlink())


def test_every_image_copies_every_package_folder() -> None:
    assert {"schemas", "config", "activities", "workflows", "workers"} <= set(PACKAGE_FOLDERS)
    for dockerfile in (DEPLOY / "Dockerfile", DEPLOY / "lambda" / "Dockerfile"):
        copied = {
            src.rstrip("/") for src in re.findall(r"^COPY (\S+) ", dockerfile.read_text(), re.M)
        }
        missing = set(PACKAGE_FOLDERS) - copied
        assert not missing, f"{dockerfile.relative_to(ROOT)} does not copy {sorted(missing)}"


PLUGIN = ROOT / "examples" / "plugin"


def _instructions(text: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", text)
    return [
        " ".join(line.split())
        for line in joined.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_plugin_image_builds_on_the_aiworker_image_and_stays_non_root() -> None:
    text = (PLUGIN / "Dockerfile").read_text()
    lines = _instructions(text)
    arg = re.search(r"^ARG AIWORKER_IMAGE=(\S+)$", text, re.M)
    # The tag deploy/ gives the image built from deploy/Dockerfile.
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert arg and version and arg.group(1) == f"aiworker:{version.group(1)}"
    froms = [line for line in lines if line.startswith("FROM ")]
    assert froms and all(f.split()[1] == "${AIWORKER_IMAGE}" for f in froms)
    final = lines[lines.index(froms[-1]) :]
    (install,) = [line for line in final if "pip install" in line]
    assert "/wheels/*.whl" in install and "--no-deps" not in install  # aiworker resolves in place
    assert "aiworker workers" in install  # a broken plugin fails the build
    # Back to the base image's unprivileged user after installing as root.
    base_user = [line for line in _stages()[-1] if line.startswith("USER ")][-1]
    assert final[-1] == base_user
    # Everything it copies exists and passes its .dockerignore.
    ignore = (PLUGIN / ".dockerignore").read_text().splitlines()
    for line in lines:
        if line.startswith("COPY ") and "--from" not in line:
            for src in line.split()[1:-1]:
                assert (PLUGIN / src).exists(), src
                assert f"!{src}" in ignore or f"!{src}/" in ignore, src


def test_deploy_readme_shows_the_plugin_dockerfile_as_it_is() -> None:
    readme = (DEPLOY / "README.md").read_text()
    (block,) = re.findall(r"```dockerfile\n(.*?)```", readme, re.S)
    assert _instructions(block) == _instructions((PLUGIN / "Dockerfile").read_text())
