"""acme-pii: the ``pii-redact`` aiworker worker (see :mod:`acme_pii.worker`)."""
