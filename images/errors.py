"""The error a push raises (push.py) and its steps (soci.py) derive from: here, so that soci,
which push runs, does not import push back (no import cycle, issue 39)."""


class PushError(Exception):
    """A push cannot go on. str() is the user-facing message (never holds a secret)."""
