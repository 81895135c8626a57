"""The aiworker command line."""
