"""rsprof.storage.live.rows: the immutable results the TUI draws, and how a location reads."""

from __future__ import annotations

import dataclasses

import pytest
from rsprof.storage.live.rows import (
    TREND_LEN,
    CallNode,
    CheckpointSummary,
    CpuRow,
    ProfileInfo,
    location_text,
)


@pytest.mark.parametrize(("file", "line", "text"), [
    ("", 0, "?"), ("", 12, "?"), ("a.c", 0, "a.c"), ("a.c", 12, "a.c:12"),
    ("/usr/lib/libc.so.6", 0, "/usr/lib/libc.so.6"),
])
def test_location_text(file: str, line: int, text: str) -> None:
    assert location_text(file, line) == text


def test_defaults_and_immutability() -> None:
    info = ProfileInfo()
    assert (info.heap_mode, info.interval_ms, info.kernel_sampled, info.python) == (
        "none", 1000, True, False)
    assert CheckpointSummary() == CheckpointSummary(count=0, samples=0)
    for value in (info, CheckpointSummary(), CallNode((), -1, "all", "", 0, 0, ())):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, dataclasses.fields(value)[0].name, 1)
    row = CpuRow(0, "f", "a.c:1", 1, 2, 0, 50.0, 100.0, 0.0, (0,) * TREND_LEN)
    assert row._replace(self_samples=2).self_samples == 2 and row.self_samples == 1
    assert TREND_LEN > 1
