"""Typed access to pipeline options, which arrive as strings from `--pipeline_options=k=v,...`.

Every getter raises `ConfigError` naming the option, the bad value and what is expected.
"""
from __future__ import annotations

import difflib

from tftrain.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def check_known(options: dict, known: tuple[str, ...], pipeline: str) -> None:
    """Rejects options the pipeline does not know, suggesting the closest known name."""
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"pipeline {pipeline!r} has no option {name!r}.{hint} "
                              f"Its options: {', '.join(known)}.")


def get_str(options: dict, name: str, default: str | None = None) -> str | None:
    """The option as a string, or `default` when absent."""
    value = options.get(name, default)
    return None if value is None else str(value)


def get_int(options: dict, name: str, default: int | None = None, minimum: int | None = None) -> int | None:
    """The option as an int (>= `minimum` when given), or `default` when absent."""
    value = options.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"pipeline option {name}={value!r} must be an integer.") from None
    if minimum is not None and number < minimum:
        raise ConfigError(f"pipeline option {name}={value!r} must be at least {minimum}.")
    return number


def get_bool(options: dict, name: str, default: bool = False) -> bool:
    """The option as a bool: 1/true/yes/on or 0/false/no/off."""
    value = options.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"pipeline option {name}={value!r} must be true or false.")


def get_size(options: dict, name: str, default: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """An image size option: `64` (square) or `64x48` (height x width)."""
    value = options.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, (list, tuple)) and len(value) >= 2:
        parts = [str(v) for v in value[:2]]
    else:
        parts = str(value).lower().split("x")
        parts = parts * 2 if len(parts) == 1 else parts
    try:
        height, width = (int(p) for p in parts)
        if height <= 0 or width <= 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"pipeline option {name}={value!r} must be a size such as 64 or 64x48 "
                          "(height x width).") from None
    return height, width
