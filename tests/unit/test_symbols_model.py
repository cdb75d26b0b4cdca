"""rsprof.collector.symbols.model: SourceFrame, the symbolizer's result (immutable, hashable:
frames are cached and compared)."""

from __future__ import annotations

import dataclasses

import pytest
from rsprof.collector.symbols.model import SourceFrame


def test_source_frames_are_values() -> None:
    a = SourceFrame("f", "f.c", 3, "_Z1fv")
    assert a == SourceFrame("f", "f.c", 3, "_Z1fv")
    assert a != SourceFrame("f", "f.c", 3, None)
    assert len({a, SourceFrame("f", "f.c", 3, "_Z1fv")}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.line = 4  # type: ignore[misc]
    assert not hasattr(a, "__dict__")  # slots: one per address and inline level
    assert [f.name for f in dataclasses.fields(SourceFrame)] == ["function", "file", "line",
                                                                 "system_name"]
