"""A Django app with a management command that holds a lock (tests/api/test_sigterm.py)."""
