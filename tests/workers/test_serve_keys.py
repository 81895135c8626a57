"""``aiworker keys add`` and what ``aiworker serve`` refuses to start with."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.front_door import running_door

from aiworker.workers.cli import main as cli
from aiworker.workers.cli.common import EXIT_OK, EXIT_USAGE
from aiworker.workers.frontdoor.auth import (
    FrontDoorRateLimiter,
    KeyRing,
    SignatureError,
    load_hooks,
    verify_stripe,
)


def test_keys_add_stores_only_the_hash_and_prints_the_key_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.json"
    args = ["keys", "add", "ci", "--tenant", "acme", "--file", str(path)]
    assert cli.main([*args, "--rate-limit", "30/min"]) == EXIT_OK
    key = capsys.readouterr().out.strip()
    assert key.startswith("aiw_") and len(key) >= 40
    text = path.read_text()
    assert key not in text
    (entry,) = json.loads(text)["keys"]
    assert entry == {
        "name": "ci",
        "tenant": "acme",
        "sha256": hashlib.sha256(key.encode()).hexdigest(),
        "rate_limit": "30/min",
    }
    assert os.stat(path).st_mode & 0o077 == 0  # readable by its owner only
    found = KeyRing.load(path).find(key)
    assert found is not None and found.tenant == "acme"

    assert cli.main(args) == EXIT_USAGE  # the name is taken
    assert "exists already" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["keys", "add", "x", "--tenant", "Not A Tenant", "--file", str(path)])
    assert exit_.value.code == EXIT_USAGE
    bad_rate = ["keys", "add", "y", "--tenant", "acme", "--file", str(path), "--rate-limit", "lots"]
    assert cli.main(bad_rate) == EXIT_USAGE
    assert "rate_limit" in capsys.readouterr().err


def test_keys_add_hashes_a_key_from_stdin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys.json"
    mine = "my-own-long-random-key-0123456789"
    monkeypatch.setattr("sys.stdin", io.StringIO(mine + "\n"))
    args = ["keys", "add", "ops", "--tenant", "beta", "--file", str(path), "--stdin"]
    assert cli.main(args) == EXIT_OK
    assert capsys.readouterr().out == ""  # the caller has it already
    found = KeyRing.load(path).find(mine)
    assert found is not None and found.name == "ops"
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert cli.main([*args[:2], "ops2", *args[3:]]) == EXIT_USAGE


@pytest.mark.parametrize(
    ("keys", "hooks", "says"),
    [
        ('{"keys": [{"name": "a", "tenant": "acme", "sha256": "abc"}]}', None, "keys.0.sha256"),
        ("{not json", None, "not valid JSON"),
        (
            None,
            '{"hooks": [{"name": "h", "pipeline": "p.json", "tenant": "acme", '
            '"signature": "github"}]}',
            "exactly one of secret and secret_env",
        ),
        (
            None,
            '{"hooks": [{"name": "h", "pipeline": "p.json", "tenant": "acme", '
            '"signature": "stripe", "secret_env": "NOT_SET_ANYWHERE"}]}',
            "$NOT_SET_ANYWHERE",
        ),
        (
            None,
            '{"hooks": [{"name": "h", "pipeline": "missing.json", "tenant": "acme", '
            '"signature": "github", "secret": "0123456789abcdef"}]}',
            "cannot read",
        ),
    ],
)
def test_serve_refuses_to_start_with_a_bad_keys_or_hooks_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    keys: str | None,
    hooks: str | None,
    says: str,
) -> None:
    for name, text, var in (("keys.json", keys, "API_KEYS"), ("hooks.json", hooks, "HOOKS")):
        if text is not None:
            (tmp_path / name).write_text(text)
            monkeypatch.setenv(f"AIWORKER_{var}_FILE", str(tmp_path / name))
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:9")
    assert cli.main(["serve", "--host", "127.0.0.1", "--port", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_serve_refuses_keys_for_tenants_the_registry_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tenants.json").write_text(json.dumps({"tenants": {"acme": {}}}))
    keys = [{"name": "b", "tenant": "beta", "sha256": "0" * 64}]
    (tmp_path / "keys.json").write_text(json.dumps({"keys": keys}))
    monkeypatch.setenv("AIWORKER_TENANTS_FILE", str(tmp_path / "tenants.json"))
    monkeypatch.setenv("AIWORKER_API_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:9")
    assert cli.main(["serve", "--host", "127.0.0.1", "--port", "0"]) == EXIT_USAGE
    assert "lacks: beta" in capsys.readouterr().err


def test_serve_refuses_a_short_hook_secret_from_its_variable(tmp_path: Path) -> None:
    """The real command, as its own process: it stops before it listens (a door that
    started would run until the timeout, which fails the test too)."""
    (tmp_path / "p.json").write_text(json.dumps({"name": "p", "steps": []}))
    hook = {"name": "h", "pipeline": "p.json", "tenant": "acme", "signature": "github"}
    (tmp_path / "hooks.json").write_text(json.dumps({"hooks": [hook | {"secret_env": "S"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env |= {
        "AIWORKER_HOOKS_FILE": str(tmp_path / "hooks.json"),
        "TEMPORAL_ADDRESS": "127.0.0.1:9",
        "S": "x",
    }
    cmd = [sys.executable, "-m", "aiworker.workers.cli.main", "serve", "--host", "127.0.0.1"]
    done = subprocess.run(
        [*cmd, "--port", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == EXIT_USAGE, done.stdout + done.stderr
    assert "$S holds 1 characters" in done.stderr and "at least 16" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_hook_secret_comes_from_its_variable(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps({"name": "p", "steps": []}))
    hook = {"name": "h", "pipeline": "p.json", "tenant": "acme", "signature": "stripe"}
    (tmp_path / "hooks.json").write_text(json.dumps({"hooks": [hook | {"secret_env": "S"}]}))
    (ready,) = load_hooks(tmp_path / "hooks.json", {"S": "from-the-environment"}).values()
    assert ready.secret == b"from-the-environment" and ready.delivery_header is None
    signed = hmac.new(ready.secret, b"1.{}", hashlib.sha256).hexdigest()
    verify_stripe(ready.secret, b"{}", f"t=1,v1=00,v1={signed}", tolerance=300, now=200)
    with pytest.raises(SignatureError, match="tolerance"):
        verify_stripe(ready.secret, b"{}", f"t=1,v1={signed}", tolerance=300, now=1e9)


def test_the_token_bucket_refills_at_its_rate() -> None:
    limiter = FrontDoorRateLimiter("2/s")
    assert limiter.take("k") == 0 and limiter.take("k") == 0
    wait = limiter.take("k")
    assert 0 < wait <= 0.5
    assert limiter.take("other") == 0  # buckets are per key
    assert [limiter.take("own", "3/min") for _ in range(4)][3] > 1  # a key's own rate


def test_the_front_door_settings_are_checked_at_start() -> None:
    from aiworker.config.settings import Settings, SettingsError

    s = Settings.from_env(
        {
            "AIWORKER_SERVE_PORT": "9000",
            "AIWORKER_SERVE_RATE_LIMIT": "10/s",
            "AIWORKER_API_KEYS_FILE": "/etc/keys.json",
            "AIWORKER_SERVE_MAX_BODY_BYTES": "2048",
        }
    )
    assert (s.serve_port, s.serve_rate_limit, s.serve_max_body_bytes) == (9000, "10/s", 2048)
    assert str(s.api_keys_file) == "/etc/keys.json" and s.hooks_file is None
    with pytest.raises(SettingsError, match="AIWORKER_SERVE_RATE_LIMIT"):
        Settings.from_env({"AIWORKER_SERVE_RATE_LIMIT": "lots"})
    with pytest.raises(SettingsError, match="AIWORKER_SERVE_PORT"):
        Settings.from_env({"AIWORKER_SERVE_PORT": "70000"})


def test_serve_refuses_to_start_with_a_broken_models_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every start checks model aliases against the models file: a broken one stops
    the door before it listens (exit 2, the file named), never a 500 per request."""
    (tmp_path / "models.json").write_text('{"models": {"small": {"provider": "nope"}}}')
    keys = [{"name": "a", "tenant": "acme", "sha256": "0" * 64}]
    (tmp_path / "keys.json").write_text(json.dumps({"keys": keys}))
    monkeypatch.setenv("AIWORKER_MODELS_FILE", str(tmp_path / "models.json"))
    monkeypatch.setenv("AIWORKER_API_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:9")
    assert cli.main(["serve", "--host", "127.0.0.1", "--port", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "models.json" in err and "small" in err and "Traceback" not in err


def _bare_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    return env | {"TEMPORAL_ADDRESS": "127.0.0.1:9"} | extra


@pytest.mark.parametrize("keys_file", [None, '{"keys": []}'], ids=["unset", "empty"])
def test_serve_without_an_api_key_refuses_to_start(tmp_path: Path, keys_file: str | None) -> None:
    """The real command, as its own process: with no API key (no file set, or a file
    without keys) every pipeline request would be a 401 that reads like a wrong
    key, so it stops before it listens, saying what to set and how to make a key."""
    extra = {}
    if keys_file is not None:
        (tmp_path / "keys.json").write_text(keys_file)
        extra["AIWORKER_API_KEYS_FILE"] = str(tmp_path / "keys.json")
    cmd = [sys.executable, "-m", "aiworker.workers.cli.main", "serve", "--host", "127.0.0.1"]
    done = subprocess.run(
        [*cmd, "--port", "0"], env=_bare_env(**extra), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == EXIT_USAGE, done.stdout + done.stderr
    assert "listening" not in done.stdout
    line = done.stderr.strip()
    assert line.startswith("aiworker: no API keys: ") and "\n" not in line, done.stderr
    assert "AIWORKER_API_KEYS_FILE" in line and "aiworker keys add" in line
    assert "--without-api-keys" in line
    assert ("holds no key" in line) == (keys_file is not None)


async def test_serve_without_api_keys_by_choice_says_so_and_refuses_every_key(
    tmp_path: Path,
) -> None:
    """``--without-api-keys`` (a door for webhooks and callbacks only) starts, says on
    stderr before it listens that every pipeline request will be refused, and does."""
    async with running_door(_bare_env(), tmp_path / "serve.log", "--without-api-keys") as door:
        out = door.proc.output()
        warned = out.index("aiworker: WARNING: no API keys (AIWORKER_API_KEYS_FILE is not set")
        assert warned < out.index("listening on"), out
        assert "every /v1/pipelines request is refused with 401" in out
        async with httpx.AsyncClient(base_url=door.url, timeout=30) as http:
            key = {"Authorization": "Bearer " + "k" * 40}
            answer = await http.post("/v1/pipelines", json={"name": "p", "steps": []}, headers=key)
    assert answer.status_code == 401, answer.text
