"""pii-redact: mask e-mail addresses and phone numbers in a text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiworker

# A match may start only where a run of its characters starts (the
# lookbehind), so that matching stays linear on a long text with no match.
EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# Nine digits or more, with short separators: "+1 415 555 0100", "(030) 123-4567";
# a date ("2024-05-01") or an order number of eight digits stays.
PHONE = re.compile(r"(?<![\w+])\+?\(?\d(?:[ ().-]{0,2}\d){8,}")


class PiiRedact(aiworker.Worker):
    """Replaces every e-mail address and phone number with a mask, and counts them."""

    spec = aiworker.WorkerSpec.from_file(Path(__file__).with_name("pii-redact.json"))

    async def execute(self, ctx: aiworker.Context, input: dict[str, Any]) -> aiworker.Result:
        mask = input.get("mask", "[redacted]")
        text, emails = EMAIL.subn(mask, input["text"])
        text, phones = PHONE.subn(mask, text)
        return aiworker.Result(outputs={"text": text, "found": {"email": emails, "phone": phones}})
