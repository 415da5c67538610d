"""A duration as object_store writes them in its options (``30s``, ``500ms``, ``2 min``, ``5``).

Pure.
"""

from __future__ import annotations

import re

from sinks.errors import ConfigError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?|m|min|mins|minutes?)?")
_UNIT_S = {
    "ms": 0.001,
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
}


def duration_seconds(name: str, raw: str) -> float:
    """The seconds ``raw`` (the value of option ``name``) says; a bare number is seconds.
    Raises `ConfigError` naming ``name`` when ``raw`` is not a duration."""
    match = _DURATION.fullmatch(raw.strip().lower())
    if match is None:
        raise ConfigError(f"{name}: {raw!r} is not a duration (such as 30s, 500ms or 2min)")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * _UNIT_S[unit]
