"""The project's own Temporal activities, in ``activities.py`` at its root as
Temporal projects keep them.

They install as the top-level module ``activities`` in the same environment
as aiworker, whose modules install only under ``aiworker.*``
(``aiworker.activities``): neither shadows the other.
"""

from __future__ import annotations

import hashlib

from temporalio import activity


@activity.defn
async def open_ticket(text: str) -> str:
    """Open a support ticket with an already redacted text; returns the ticket id."""
    ticket = "T-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    activity.logger.info("ticket %s opened (%d characters)", ticket, len(text))
    return ticket
