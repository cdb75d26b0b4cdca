"""rsprof.collector.symbols.cache: the per-build-id cache of symbolized addresses: JSON
only, and every failure (corrupt file, another format, a bad row) a miss, never an error."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from rsprof.collector.symbols.cache import FORMAT, FrameCache, decode, encode
from rsprof.collector.symbols.model import SourceFrame

FRAMES = (SourceFrame("inlined", "a.h", 3, None), SourceFrame("f", "a.c", 10, "_Z1fv"))


def test_encode_decode_round_trip() -> None:
    assert decode(encode(FRAMES)) == FRAMES
    assert decode(encode((SourceFrame("é ☃", "", 0, None),))) == (SourceFrame("é ☃", "", 0,
                                                                              None),)


@pytest.mark.parametrize("text", [
    "", "not json", "{}", "[]", "null", '"x"', "[[]]", '[["f", "a.c", 1]]',
    '[["f", "a.c", "1", null]]', '[["f", "a.c", 1, 5]]', '[[1, "a.c", 1, null]]',
    '[["f", null, 1, null]]', '[["f", "a.c", 1, null], "junk"]',
])
def test_anything_else_decodes_to_none(text: str) -> None:
    assert decode(text) is None


def test_put_and_get(tmp_path: Path) -> None:
    cache = FrameCache(tmp_path / "symbols" / "b1-x.db", "debuglink")
    cache.put_many({0x10: FRAMES, 0x20: FRAMES[:1], -1: FRAMES, 1 << 63: FRAMES})
    assert cache.get_many([0x10, 0x20, 0x30, -1, 1 << 63]) == {0x10: FRAMES, 0x20: FRAMES[:1]}
    assert cache.get_many([]) == {}
    cache.close()
    again = FrameCache(tmp_path / "symbols" / "b1-x.db", "debuglink")
    assert again.get_many(range(0, 0x40)) == {0x10: FRAMES, 0x20: FRAMES[:1]}
    again.close()


def test_many_addresses_in_chunks(tmp_path: Path) -> None:
    cache = FrameCache(tmp_path / "c.db", "")
    cache.put_many({a: FRAMES for a in range(1234)})
    assert len(cache.get_many(range(2000))) == 1234
    cache.close()


@pytest.mark.parametrize(("format", "source", "kept"), [
    (FORMAT, "debuglink", True),
    (FORMAT, "build-id", False),  # a debug file appeared since: start fresh
    ("2", "debuglink", False),  # an older format
])
def test_entries_of_another_format_or_source_are_dropped(tmp_path: Path, format: str,
                                                         source: str, kept: bool) -> None:
    path = tmp_path / "c.db"
    FrameCache(path, "debuglink").put_many({0x10: FRAMES})
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'format'", (format,))
    conn.execute("UPDATE meta SET value = ? WHERE key = 'source'", (source,))
    conn.commit()
    conn.close()
    assert FrameCache(path, "debuglink").get_many([0x10]) == ({0x10: FRAMES} if kept else {})


def test_a_bad_row_is_a_miss(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    cache = FrameCache(path, "")
    cache.put_many({0x10: FRAMES, 0x20: FRAMES})
    cache.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE frames SET frames = ? WHERE vaddr = 16", (json.dumps({"x": 1}),))
    conn.commit()
    conn.close()
    assert FrameCache(path, "").get_many([0x10, 0x20]) == {0x20: FRAMES}


def test_a_corrupt_file_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    path.write_bytes(b"this is not a database" * 100)
    cache = FrameCache(path, "")
    assert cache.get_many([0x10]) == {}
    cache.put_many({0x10: FRAMES})
    assert cache.get_many([0x10]) == {0x10: FRAMES}
    cache.close()


def test_an_unwritable_place_disables_the_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = FrameCache(blocker / "symbols" / "c.db", "")  # a folder under a file
    cache.put_many({0x10: FRAMES})
    assert cache.get_many([0x10]) == {}
    assert cache._disabled
