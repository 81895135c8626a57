"""Who may call the HTTP front door: API keys, webhooks and their signatures, rates.

**API keys** (``AIWORKER_API_KEYS_FILE``, JSON)::

    {"keys": [{"name": "ci", "tenant": "acme", "sha256": "<64 hex>", "rate_limit": "60/min"}]}

A key is presented as ``Authorization: Bearer <key>``; the file holds only the
SHA-256 of each key, so a leaked file or backup grants nothing. SHA-256 and not
a password hash (bcrypt, scrypt, argon2) on purpose: the keys are not chosen by
people but drawn by :func:`new_key` (256 random bits), so there is no dictionary
to try and a fast hash is as strong as a slow one, while a slow hash would cost
every request tens of milliseconds of CPU and turn the front door into a
denial-of-service lever. ``aiworker keys add`` draws a key, writes its hash and
prints the key once, so nobody writes a hash by hand. The key decides the
tenant; a request cannot choose another.

**Webhooks** (``AIWORKER_HOOKS_FILE``, JSON)::

    {"hooks": [{"name": "github-push", "pipeline": "on-push.json", "tenant": "acme",
                "signature": "github", "secret_env": "GITHUB_WEBHOOK_SECRET"}]}

``pipeline`` is relative to the hooks file. ``signature`` is ``github``
(``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>``) or ``stripe``
(``Stripe-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">``, the
timestamp within ``tolerance_seconds`` of now, against replays). Digests are
compared in constant time (:func:`hmac.compare_digest`).

**Rates**: a token bucket per API key and per hook (:class:`FrontDoorRateLimiter`), in
this process: ``N/period`` refills N tokens per period and holds at most N, so
a quiet key may burst up to N requests.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from aiworker.schemas.files import read_capped
from aiworker.schemas.names import TENANT_PATTERN
from aiworker.schemas.spec import parse_rate
from aiworker.workers.errors import StartupError

# Files an operator writes by hand or with `aiworker keys add`; no reason to read more.
MAX_CONFIG_FILE_BYTES = 1024 * 1024
KEY_PREFIX = "aiw_"
# A key presented on a request: long enough for any key new_key draws, short enough
# that hashing a hostile header costs nothing.
MAX_KEY_CHARS = 256
MIN_KEY_CHARS = 24
# A webhook secret, written in the file or read from `secret_env`: GitHub and Stripe
# draw long ones; a short one could be guessed from signed requests offline.
MIN_SECRET_CHARS = 16
# Buckets of the front door's rate limiter (one per key, hook and refused caller):
# past this, full buckets (the same as absent ones) are dropped, then the oldest.
MAX_BUCKETS = 10_000
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _checked_rate(text: str) -> str:
    parse_rate(text)  # raises ValueError naming the form
    return text


RateText = Annotated[str, AfterValidator(_checked_rate)]
"""A rate such as ``60/min``, checked where it is read."""


class ServeConfigError(StartupError):
    """The keys or hooks file cannot start the front door; the message names file and field."""


class ApiKey(BaseModel):
    """One API key: who it is, its tenant, the SHA-256 of the key, its rate."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1, max_length=100, description="who holds the key (logs)")
    tenant: str = Field(pattern=TENANT_PATTERN, description="the tenant the key acts for")
    sha256: str = Field(description="hex SHA-256 of the key (aiworker keys add)")
    rate_limit: RateText | None = Field(
        default=None, description="requests per period, e.g. 60/min (AIWORKER_SERVE_RATE_LIMIT)"
    )

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        if not _HEX64.match(v):
            raise ValueError("expected 64 lower-case hex digits (aiworker keys add)")
        return v


class KeysFile(BaseModel):
    """The content of ``AIWORKER_API_KEYS_FILE``."""

    model_config = ConfigDict(extra="forbid")
    keys: list[ApiKey] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> KeysFile:
        names = [k.name for k in self.keys]
        if len(set(names)) != len(names):
            raise ValueError("key names must be unique")
        return self


class Hook(BaseModel):
    """One webhook: the pipeline it starts, for which tenant, and how it is signed."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    pipeline: Path = Field(description="pipeline file, relative to the hooks file")
    tenant: str = Field(pattern=TENANT_PATTERN)
    signature: Literal["github", "stripe"]
    secret: str | None = Field(default=None, min_length=MIN_SECRET_CHARS, repr=False)
    secret_env: str | None = Field(default=None, description="variable holding the secret")
    tolerance_seconds: float = Field(default=300, gt=0, le=86400, description="stripe")
    delivery_header: str | None = Field(
        default=None,
        description="header with the delivery id (default X-GitHub-Delivery for github; "
        "none for stripe: the body's hash)",
    )
    rate_limit: RateText | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> Hook:
        if (self.secret is None) == (self.secret_env is None):
            raise ValueError("give exactly one of secret and secret_env")
        return self


@dataclass(frozen=True)
class ReadyHook:
    """A hook with its secret read and its pipeline file parsed (at start-up)."""

    hook: Hook
    secret: bytes
    pipeline: dict[str, Any]

    @property
    def delivery_header(self) -> str | None:
        """The header naming a delivery, by the hook's style unless configured."""
        if self.hook.delivery_header:
            return self.hook.delivery_header
        return "X-GitHub-Delivery" if self.hook.signature == "github" else None


def _read_json(path: Path, what: str) -> Any:
    raw = read_capped(path, MAX_CONFIG_FILE_BYTES, f"{what} {path}", ServeConfigError)
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ServeConfigError(f"{what} {path}: not valid JSON: {e}") from None


def _problems(e: ValidationError) -> str:
    out = []
    for err in e.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(the whole file)"
        out.append(f"{where}: {err['msg']}")
    return "; ".join(out)


def hash_key(key: str) -> str:
    """The hex SHA-256 of an API key, as the keys file stores it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A fresh API key: ``aiw_`` and 256 random bits (URL-safe base64)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyRing:
    """The API keys of one front door, looked up by the key a request presents."""

    def __init__(self, keys: list[ApiKey]) -> None:
        self.keys = list(keys)

    @classmethod
    def load(cls, path: Path | None) -> KeyRing:
        """Read ``AIWORKER_API_KEYS_FILE``; no file means no key (every call refused).

        Raises:
            ServeConfigError: the file cannot be read or is not a keys file.
        """
        if path is None:
            return cls([])
        try:
            return cls(KeysFile.model_validate(_read_json(path, "API keys file")).keys)
        except ValidationError as e:
            raise ServeConfigError(f"API keys file {path}: {_problems(e)}") from None

    def find(self, presented: str) -> ApiKey | None:
        """The key whose hash matches ``presented``, or None.

        Every entry is compared, each in constant time, so the answer's timing
        says nothing about which digits matched.
        """
        if not MIN_KEY_CHARS <= len(presented) <= MAX_KEY_CHARS:
            return None
        digest = hash_key(presented)
        found = None
        for k in self.keys:
            if hmac.compare_digest(digest, k.sha256):
                found = k
        return found


def add_key(path: Path, name: str, tenant: str, rate_limit: str | None, key: str) -> ApiKey:
    """Add ``key`` (hashed) under ``name`` to the keys file at ``path`` (created 0600).

    Raises:
        ServeConfigError: the file is not a keys file, or ``name`` is taken.
    """
    current = KeysFile()
    if path.exists():
        try:
            current = KeysFile.model_validate(_read_json(path, "API keys file"))
        except ValidationError as e:
            raise ServeConfigError(f"API keys file {path}: {_problems(e)}") from None
    if any(k.name == name for k in current.keys):
        raise ServeConfigError(f"API keys file {path}: a key named {name!r} exists already")
    try:
        entry = ApiKey(name=name, tenant=tenant, sha256=hash_key(key), rate_limit=rate_limit)
    except ValidationError as e:
        raise ServeConfigError(_problems(e)) from None
    current.keys.append(entry)
    text = json.dumps(current.model_dump(mode="json", exclude_none=True), indent=2) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # readers never see half a file
    return entry


def load_hooks(path: Path | None, env: Mapping[str, str]) -> dict[str, ReadyHook]:
    """Read ``AIWORKER_HOOKS_FILE``: each hook's secret and pipeline file, by name.

    Raises:
        ServeConfigError: the file, a secret or a pipeline file is unusable.
    """
    if path is None:
        return {}
    raw = _read_json(path, "hooks file")
    if not isinstance(raw, dict) or not isinstance(raw.get("hooks"), list):
        raise ServeConfigError(f'hooks file {path}: expected {{"hooks": [...]}}')
    out: dict[str, ReadyHook] = {}
    for i, item in enumerate(raw["hooks"]):
        try:
            hook = Hook.model_validate(item)
        except ValidationError as e:
            raise ServeConfigError(f"hooks file {path}: hooks[{i}]: {_problems(e)}") from None
        if hook.name in out:
            raise ServeConfigError(f"hooks file {path}: hook {hook.name!r} is listed twice")
        secret = hook.secret
        if hook.secret_env is not None:
            secret = env.get(hook.secret_env) or None
            if secret is None:
                raise ServeConfigError(
                    f"hooks file {path}: hook {hook.name!r}: ${hook.secret_env} is not set"
                )
            if len(secret) < MIN_SECRET_CHARS:
                raise ServeConfigError(
                    f"hooks file {path}: hook {hook.name!r}: ${hook.secret_env} holds "
                    f"{len(secret)} characters; a webhook secret needs at least "
                    f"{MIN_SECRET_CHARS}"
                )
        pipeline = _read_json(path.parent / hook.pipeline, f"hook {hook.name!r} pipeline")
        if not isinstance(pipeline, dict):
            raise ServeConfigError(f"hook {hook.name!r}: {hook.pipeline} is not a JSON object")
        out[hook.name] = ReadyHook(hook, (secret or "").encode("utf-8"), pipeline)
    return out


class SignatureError(ValueError):
    """A webhook whose signature is missing, malformed, wrong or too old."""


def _hmac_hex(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def verify_github(secret: bytes, body: bytes, header: str | None) -> None:
    """Check ``X-Hub-Signature-256: sha256=<hex>`` over the raw body.

    Raises:
        SignatureError: the header is missing, malformed or does not match.
    """
    if not header:
        raise SignatureError("the X-Hub-Signature-256 header is missing")
    scheme, _, given = header.strip().partition("=")
    if scheme != "sha256" or not given:
        raise SignatureError("X-Hub-Signature-256 is not of the form sha256=<hex>")
    if not hmac.compare_digest(_hmac_hex(secret, body), given.lower()):
        raise SignatureError("the signature does not match the body")


def verify_stripe(
    secret: bytes, body: bytes, header: str | None, tolerance: float, now: float | None = None
) -> None:
    """Check ``Stripe-Signature: t=<unix time>,v1=<hex>[,v1=...]`` over ``"<t>.<body>"``.

    Raises:
        SignatureError: the header is missing or malformed, no ``v1`` matches,
            or ``t`` is more than ``tolerance`` seconds from now.
    """
    if not header:
        raise SignatureError("the Stripe-Signature header is missing")
    stamp: str | None = None
    candidates: list[str] = []
    for part in header.split(",")[:32]:
        key, _, value = part.strip().partition("=")
        if key == "t":
            stamp = value
        elif key == "v1":
            candidates.append(value.lower())
    if (
        stamp is None
        or not (stamp.isascii() and stamp.isdigit())
        or len(stamp) > 12
        or not candidates
    ):
        raise SignatureError("Stripe-Signature is not of the form t=<unix time>,v1=<hex>")
    expected = _hmac_hex(secret, stamp.encode() + b"." + body)
    # Every candidate compared, in constant time: no early exit on a match.
    matched = [hmac.compare_digest(expected, c) for c in candidates]
    if not any(matched):
        raise SignatureError("the signature does not match the body")
    age = (time.time() if now is None else now) - int(stamp)
    if abs(age) > tolerance:
        raise SignatureError(
            f"the signature's timestamp is {abs(age):.0f}s from now, beyond the "
            f"tolerance of {tolerance:g}s"
        )


class FrontDoorRateLimiter:
    """A token bucket per key: ``N/period`` refills N tokens a period, holds at most N.

    In this process only: with several replicas each grants its own rate (the
    docs say so); the worker's limiter is for pipelines' calls, not for requests.
    """

    def __init__(self, default_rate: str) -> None:
        self._default = parse_rate(default_rate)
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill)

    def _prune(self, now: float) -> None:
        """Bounded memory whoever calls: drop the buckets that have refilled
        (at the default rate, so a few with their own rate may restart full),
        then, if that is not enough, the older half."""
        limit, period = self._default
        full = [
            k
            for k, (tokens, last) in self._buckets.items()
            if tokens + (now - last) * limit / period >= limit
        ]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= MAX_BUCKETS:
            by_age = sorted(self._buckets, key=lambda k: self._buckets[k][1])
            for k in by_age[: len(by_age) // 2]:
                del self._buckets[k]

    def wait(self, key: str, rate: str | None = None) -> float:
        """Seconds until ``key`` has a token (0: it has one now); takes none."""
        limit, period = parse_rate(rate) if rate else self._default
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (float(limit), now))
        tokens = min(float(limit), tokens + (now - last) * limit / period)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) * period / limit

    def take(self, key: str, rate: str | None = None) -> float:
        """Take one token for ``key``; 0 when granted, else seconds until one is there."""
        limit, period = parse_rate(rate) if rate else self._default
        per_second = limit / period
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (float(limit), now))
            tokens = min(float(limit), tokens + (now - last) * per_second)
            if len(self._buckets) >= MAX_BUCKETS and key not in self._buckets:
                self._prune(now)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / per_second
