"""The ``callback-tokens`` local activity: the secrets of a wait step's tokens.

Outside the workflow sandbox on purpose: a token's secret must be unguessable,
so it comes from :mod:`secrets` (the OS's CSPRNG), and as an activity result it
is recorded in the history, where replay reads it back. The same answer carries
the public base URL of ``aiworker serve`` (``AIWORKER_SERVE_PUBLIC_URL``) as this
process's settings say, so the run builds its ``callback_url`` from its record.
"""

from __future__ import annotations

import secrets

from temporalio import activity

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.callbacks import TokenCall, TokenGrant


class CallbackActivities:
    """The tokens activity over one process's settings."""

    def __init__(self, settings: Settings) -> None:
        self._base_url = settings.serve_public_url

    @activity.defn(name=names.CALLBACK_TOKENS)
    async def tokens(self, call: TokenCall) -> TokenGrant:
        """``call.count`` fresh secrets (32 random bytes each, base64url)."""
        return TokenGrant(
            secrets=[secrets.token_urlsafe(32) for _ in range(call.count)],
            base_url=self._base_url,
        )


__all__ = ["CallbackActivities"]
