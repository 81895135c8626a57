"""The built-in workers, one instance each: what every worker process serves
before plugins and spec files add theirs. A new built-in is one module with a
:class:`~aiworker.activities.sdk.Worker` subclass, one spec file in
``schemas/workers/`` and its line here."""

from __future__ import annotations

from aiworker.activities.sdk import Worker


def builtin_workers() -> list[Worker]:
    """A fresh instance of every built-in worker."""
    # Imported here: a process that only checks pipelines never loads the
    # HTML parser, the model clients or the publish ledger.
    from aiworker.activities.aggregator import Aggregator
    from aiworker.activities.llm_call import LlmCall
    from aiworker.activities.publish import Publish
    from aiworker.activities.validator import Validator
    from aiworker.activities.web_scrape import WebScrape

    return [Validator(), Aggregator(), WebScrape(), LlmCall(), Publish()]
