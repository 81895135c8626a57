"""pii-redact through the same runtime an aiworker process uses (no server):
input and output schemas, the envelope, error codes."""

from __future__ import annotations

from typing import Any

import pytest
from aiworker.testing import run_worker
from temporalio.exceptions import ApplicationError

from acme_pii.worker import PiiRedact


async def test_masks_emails_and_phone_numbers() -> None:
    text = "Mail jane.doe@example.com or j@x.org, call +1 415 555 0100 or (030) 123-4567."
    response = await run_worker(PiiRedact(), {"text": text, "mask": "***"})
    assert response.status == "succeeded"
    assert response.outputs == {
        "text": "Mail *** or ***, call *** or ***.",
        "found": {"email": 2, "phone": 2},
    }


async def test_leaves_dates_and_short_numbers() -> None:
    text = "Order 1234 shipped on 2024-05-01."
    response = await run_worker(PiiRedact(), {"text": text})
    assert response.outputs == {"text": text, "found": {"email": 0, "phone": 0}}


@pytest.mark.parametrize("example", PiiRedact.spec.examples, ids=lambda e: e.description)
async def test_spec_examples_keep_the_contract(example: Any) -> None:
    # run_worker checks the outputs against output_schema, as the process does.
    response = await run_worker(PiiRedact(), example.input)
    assert response.worker_id == "pii-redact"
    assert response.status == "succeeded"


async def test_input_outside_the_schema_is_invalid_input() -> None:
    with pytest.raises(ApplicationError) as e:
        await run_worker(PiiRedact(), {"body": "no text field"})
    assert e.value.type == "invalid_input"
    assert e.value.non_retryable
