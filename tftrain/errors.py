"""Errors that end a command with one clear message instead of a traceback."""


class TftrainError(Exception):
    """A problem the user can fix: bad input, config, data or environment.

    The message says what went wrong, where, and how to fix it. The CLI prints it on one line
    and exits with `exit_code`.
    """

    exit_code = 1


class ConfigError(TftrainError):
    """A bad flag, config file, key, value or combination of values."""

    exit_code = 2


class DataError(TftrainError):
    """Missing, corrupt or invalid data."""


class BadRow(Exception):
    """One raw row cannot be read, decoded or validated; the converter skips and records it."""


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of `error`'s message (at most `limit` characters), or its type's name."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:limit]
