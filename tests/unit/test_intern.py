"""rsprof.storage.intern: ids are given out in memory while symbolizing, with no SQL; the
writer stores the new rows with the next checkpoint, in its transaction; appending to a
file continues its ids and knows what it holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from rsprof.storage import intern
from rsprof.storage.intern import InternTable, LocationKey
from rsprof.storage.reader import Profile
from rsprof.storage.samples import load_samples
from rsprof.storage.writer import Checkpoint, ProfileWriter


def count(path: Path, table: str) -> int:
    return int(sqlite3.connect(path).execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def test_one_id_per_distinct_value() -> None:
    ids = InternTable()
    module = ids.module_id("/bin/app", "ab")
    assert ids.module_id("/bin/app", "ab") == module != ids.module_id("/bin/app", None)
    work = LocationKey("work", "app.c", 3, module)
    assert ids.location_id(work) == ids.location_id(LocationKey("work", "app.c", 3, module,
                                                                "work.constprop.0"))
    leaf = ids.frame_id(0x1000, module, 0x1000, [work])
    assert ids.frame_id(0x1000, module, 0x1000, [work]) == leaf
    caller = ids.frame_id(0x1000, module, 0x1000, [LocationKey("work", "app.c", 2, module)])
    assert caller != leaf and ids.has_frame(0x1000, module)
    stack = ids.stack_id([leaf, caller])
    assert ids.stack_id((leaf, caller)) == stack != ids.stack_id([caller])
    assert ids.stack_leaf_location[stack] == ids.location_id(work)
    rows = ids.take()
    assert [len(rows.modules), len(rows.locations), len(rows.frames), len(rows.stacks)] == [
        2, 2, 2, 2]
    assert rows.stacks == {stack: (leaf, caller), stack + 1: (caller,)}
    assert not ids.take()  # taken once


def test_rows_are_stored_with_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    writer = ProfileWriter(path)
    module = writer.ids.module_id("/bin/app", None)
    writer.ids.add_mapping(module, 0x400000, 0x401000, 0)
    frame = writer.ids.frame_id(0x400010, module, 0x10, [LocationKey("main", "a.c", 1, module)])
    stack = writer.ids.stack_id([frame])
    assert count(path, "stacks") == count(path, "frames") == 0  # nothing written yet
    writer.write_checkpoint(Checkpoint(timestamp_ms=1, samples=3, cpu={(stack, 7): 3}))
    assert count(path, "stacks") == count(path, "frames") == count(path, "mappings") == 1
    writer.finish("test")
    with Profile(path) as profile:
        (sample,) = load_samples(profile, "cpu").samples
    assert sample.frames[0].lines[0].function == "main" and sample.values[0] == 3
    assert sample.frames[0].mapping is not None


@pytest.mark.parametrize("json_functions", [True, False])
def test_stacks_are_stored_as_rows_leaf_first(tmp_path: Path, json_functions: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """InternedRows.store writes a checkpoint's stacks in one statement per table (JSON
    expanded by SQLite; a row per frame where SQLite has no JSON functions): the rows are
    those one INSERT per frame wrote, position 0 the leaf, depth the frame count, an empty
    stack a `stacks` row alone."""
    monkeypatch.setattr(intern, "_JSON", [json_functions])
    path = tmp_path / "p.db"
    writer = ProfileWriter(path)
    module = writer.ids.module_id("/bin/app", None)
    frames = [writer.ids.frame_id(0x10 * i, module, 0x10 * i,
                                  [LocationKey(f"f{i}", "a.c", i, module)])
              for i in range(1, 45)]
    deep = writer.ids.stack_id(frames)
    shallow = writer.ids.stack_id([frames[3], frames[0]])
    empty = writer.ids.stack_id([])
    writer.write_checkpoint(Checkpoint(timestamp_ms=1, cpu={(deep, 1): 1}))
    later = writer.ids.stack_id([frames[0], frames[40]])  # the next checkpoint's
    writer.write_checkpoint(Checkpoint(timestamp_ms=2, cpu={(later, 1): 1}))
    writer.finish("test")
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT id, depth FROM stacks ORDER BY id").fetchall() == [
        (deep, 44), (shallow, 2), (empty, 0), (later, 2)]
    rows = conn.execute("SELECT stack_id, position, frame_id FROM stack_frames"
                        " ORDER BY stack_id, position").fetchall()
    conn.close()
    assert rows == [*((deep, i, frame) for i, frame in enumerate(frames)),
                    (shallow, 0, frames[3]), (shallow, 1, frames[0]),
                    (later, 0, frames[0]), (later, 1, frames[40])]
    assert all(type(value) is int for row in rows for value in row)


def test_appending_continues_the_ids(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    writer = ProfileWriter(path)
    module = writer.ids.module_id("/bin/app", None)
    main = LocationKey("main", "a.c", 1, module)
    first = writer.ids.stack_id([writer.ids.frame_id(0x10, module, 0x10, [main])])
    writer.write_checkpoint(Checkpoint(timestamp_ms=1, cpu={(first, 1): 1}))
    writer.finish("test")
    again = ProfileWriter(path, append=True)
    assert again.ids.module_id("/bin/app", None) == module
    assert again.ids.stack_id([again.ids.frame_id(0x10, module, 0x10, [main])]) == first
    work = LocationKey("work", "a.c", 5, module)
    second = again.ids.stack_id([again.ids.frame_id(0x20, module, 0x20, [work])])
    assert second == first + 1
    again.write_checkpoint(Checkpoint(timestamp_ms=2, cpu={(first, 1): 1, (second, 1): 2}))
    again.finish("test")
    assert count(path, "stacks") == 2 and count(path, "locations") == 2
