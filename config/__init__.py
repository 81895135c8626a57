"""What one aiworker process is configured with: its settings (every
``AIWORKER_*`` variable, :mod:`~aiworker.config.settings`), the worker specs it
knows (:mod:`~aiworker.config.catalog`) and the optional parts installed
(:mod:`~aiworker.config.extras`).

It sits just above the contracts: ``schemas`` <- ``config`` <- ``activities``,
``workflows`` and ``workers``. Workflows never read settings; they see the
catalog only through what a run recorded at its start.
"""
