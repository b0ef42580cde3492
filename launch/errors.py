"""Errors meant for the user: tasks print the message and exit non-zero, no traceback."""


class LaunchError(Exception):
    """A problem the user can fix; the message names the file/line/host at fault."""
