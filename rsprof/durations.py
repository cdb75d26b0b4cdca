"""Durations as users type them: 10s, 500ms, 5m, 1h30m, 1.5h, or plain seconds."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
# Longer than any recording or window (ten years): beyond it timers and timestamps
# overflow (`-i 99999999999999h` was an internal error).
MAX_SECONDS = 10 * 365 * 86400.0


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """Seconds in `text`; ValueError with a readable message when it is not a duration.
    A point in a recording (`--since 0s`) may be zero; a length may not."""
    cleaned = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", cleaned):
        seconds = float(cleaned)
    else:
        parts = _PART.findall(cleaned)
        if not parts or "".join(n + u for n, u in parts) != cleaned:
            raise ValueError(f"{text!r} is not a duration (examples: 10s, 500ms, 5m, 1h)")
        seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{text!r} is not a positive duration")
    if not seconds <= MAX_SECONDS:
        raise ValueError(f"{text!r} is longer than ten years")
    return seconds
