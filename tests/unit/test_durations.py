"""rsprof.durations: durations as users type them (-d, -i, --since, --until)."""

from __future__ import annotations

import pytest

from rsprof.durations import MAX_SECONDS, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("10", 10.0), ("1.5", 1.5), ("10s", 10.0), ("500ms", 0.5), ("5m", 300.0), ("1h", 3600.0),
    ("1d", 86400.0), ("1h30m", 5400.0), ("1.5h", 5400.0), ("2m30s", 150.0),
    ("1s500ms", 1.5), (" 10S ", 10.0), ("10MS", 0.01), ("3650d", MAX_SECONDS),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "message"), [
    ("", "is not a duration"), ("s", "is not a duration"), ("10x", "is not a duration"),
    ("10 s", "is not a duration"), ("-5s", "is not a duration"), ("1e3", "is not a duration"),
    ("5s garbage", "is not a duration"), ("inf", "is not a duration"),
    ("nan", "is not a duration"), ("0", "not a positive duration"),
    ("0s", "not a positive duration"), ("0ms", "not a positive duration"),
    ("3651d", "longer than ten years"), ("99999999999999h", "longer than ten years"),
])
def test_not_durations(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0", "0s", "0ms", "0.0"])
def test_a_point_may_be_zero(text: str) -> None:
    assert parse_duration(text, allow_zero=True) == 0.0
