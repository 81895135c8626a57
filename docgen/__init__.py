"""The generated half of ``docs/`` (``docs/reference/``), built from the code.

A contributor's tool, kept in the source tree and not installed with
aiworker: ``make docs`` (``python -m docgen``) writes the pages,
``python -m docgen check`` lists the ones that differ, and the test suite
runs the same check. :mod:`docgen.pages` assembles the pages,
:mod:`docgen.render` turns models and JSON Schemas into Markdown, and
:mod:`docgen.notes` holds what no model says.
"""
