"""Redaction of secrets from text that leaves the process (logs, failures).

Configured secret values (``Settings.secret_values()``) are replaced wherever
they appear, also in their JSON-escaped form. Credential-looking pairs lose
their value even when it is not a configured secret: ``Authorization``/
``Proxy-Authorization`` (any scheme), ``X-Api-Key``, ``X-Auth-Token``,
``api_key``/``apikey``, ``access_token`` and other ``*_token``s, ``token``,
``password``/``passwd``/``pwd``, ``secret``/``client_secret``, a bare
``Bearer`` token, and ``Cookie``/``Set-Cookie`` to the end of the header. URLs
lose their userinfo and the values of their query and fragment
(``https://user:pw@host/hook?token=abc`` -> ``https://host/hook?token=…``), so
a webhook or page URL that carries a credential can be quoted in a message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

_KEYS = (
    r"(?:proxy-)?authorization|x-api-key|x-auth-token|api[_-]?key|apikey"
    r"|(?:access|refresh|id|auth|session)[_-]?token|\btoken"
    r"|password|passwd|\bpwd|client[_-]?secret|\bsecret(?:[_-]?key)?"
)
# ``key: value``, ``key=value``, ``"key": "value"``: the value up to a separator; an
# ``Authorization`` value keeps its scheme word inside the redaction.
_CREDENTIALS = re.compile(
    rf"(?i)({_KEYS})([\"']?\s*[:=]\s*[\"']?)"
    r"((?:(?:bearer|basic|token|digest)\s+)?[^\s\"'&,;<>…]+)"
)
# Every alternative of _KEYS holds one of these (lowercase): where none is in a
# text, _CREDENTIALS cannot match it.
_KEY_STEMS = ("auth", "api", "token", "passw", "pwd", "secret")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)([A-Za-z0-9._~+/=-]{6,})")
# A cookie header's value runs to the end of the line (or of a quoted string).
_COOKIES = re.compile(r"(?i)\b(set-cookie|cookie)([\"']?\s*:\s*[\"']?)([^\r\n\"']+)")
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s\"'<>]+)")
_QUERY_VALUE = re.compile(r"=[^&;#]*")
REDACTED = "[REDACTED]"
ELIDED = "…"

# Shorter values would redact ordinary words; real keys are far longer.
MIN_SECRET_LENGTH = 4


class Redactor:
    """Removes secret values and credential-looking pairs from text.

    Args:
        secrets: values to remove wherever they appear.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}
        # A secret with quotes or backslashes looks different inside JSON text.
        values |= {json.dumps(s)[1:-1] for s in values}
        self.secrets = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, REDACTED)
        # Each pattern runs only where the words it needs are in the text: a log line
        # is redacted once per field and once whole, and four regex passes over every
        # line were a tenth of a crawl worker's CPU (bench/crawl.py). Exact for ASCII
        # text, where lowercasing is what ``(?i)`` matches; other text takes every pass.
        return redact_patterns(text, text.lower() if text.isascii() else None)

    def contains_secret(self, text: str) -> bool:
        """Whether ``text`` holds a configured secret value."""
        return any(s in text for s in self.secrets)

    def value(self, v: Any) -> Any:
        """``v`` with every string inside it (dict keys too) redacted."""
        if isinstance(v, str):
            return self(v)
        if isinstance(v, dict):
            return {self.value(k): self.value(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self.value(x) for x in v]
        return v


def redact_patterns(text: str, words: str | None = None) -> str:
    """``text`` through the patterns (URLs, cookies, credential pairs, bare bearer
    tokens), in that order, without the configured secrets.

    ``words``, the ASCII ``text`` lowercased, skips a pattern whose words are not
    in it (None: every pattern runs). The substitutions only remove text and
    insert ``[REDACTED]`` or ``…`` beside separators, so they never make a needed
    word appear for a later pattern.
    """
    if words is None or "://" in text:
        text = _URL.sub(_clean_url, text)
    if words is None or "cookie" in words:
        text = _COOKIES.sub(_blank_value, text)
    if words is None or any(stem in words for stem in _KEY_STEMS):
        text = _CREDENTIALS.sub(_blank_value, text)
    if words is None or "bearer" in words:
        text = _BEARER.sub(_blank_value, text)
    return text


def _blank_value(m: re.Match[str]) -> str:
    return f"{m.group(1)}{m.group(2)}{REDACTED}"


def _clean_url(m: re.Match[str]) -> str:
    """A URL without userinfo, with every query and fragment value elided."""
    rest = m.group(2)
    cut = len(rest)
    for sep in "/?#":
        i = rest.find(sep)
        if i != -1:
            cut = min(cut, i)
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        authority = authority.rsplit("@", 1)[1]
    path, mark, query = tail.partition("?")
    if not mark:
        path, mark, query = tail.partition("#")
    if mark:
        parts = re.split(r"([&;#])", query)
        # Even indexes are the parts, odd ones the separators kept between them.
        query = "".join(
            p if i % 2 or not p else _QUERY_VALUE.sub("=" + ELIDED, p) if "=" in p else ELIDED
            for i, p in enumerate(parts)
        )
    return f"{m.group(1)}{authority}{path}{mark}{query}"
