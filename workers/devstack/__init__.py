"""The local dev stack: dev server, model server, demo site, supervisor."""
