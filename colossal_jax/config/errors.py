"""The one error a user's configuration raises, and the "did you mean" helpers its messages use.

A :class:`ConfigError` is reported as one line ``error: …`` by every entry point, before anything
compiles; its message names the bad value and a valid alternative.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """An impossible configuration, reported before anything compiles."""


def suggest(value: Any, valid: Any, prefix: str = "", suffix: str = "") -> str:
    """``prefix`` "did you mean 'x'?" ``suffix`` for a near miss (any case) of one of ``valid``,
    or "" when nothing is close."""
    import difflib

    lowered = {str(v).lower(): str(v) for v in valid}
    key = str(value).lower()
    close = [key] if key in lowered else difflib.get_close_matches(key, list(lowered), n=1)
    return f"{prefix}did you mean {lowered[close[0]]!r}?{suffix}" if close else ""


# ---- parallel -----------------------------------------------------------------------------------


def choice(flag: str, value: Any, valid: tuple[str, ...]) -> str:
    """The message for ``value`` not among ``valid`` (with a near miss suggested)."""
    return f"{flag} {value!r} is not one of {', '.join(valid)}{suggest(value, valid, '; ')}"
