"""Values real programs produce that once ended a recording: unsigned 64-bit addresses and
offsets (>= 2^63), and GCC clones that share a function's source lines."""

from __future__ import annotations

from pathlib import Path

from rsprof.storage.intern import LocationKey
from rsprof.storage.reader import Profile
from rsprof.storage.samples import load_samples
from rsprof.storage.schema import u64_from_sql, u64_to_sql
from rsprof.storage.writer import Checkpoint, ProfileWriter

HIGH_VALUES = [0, 1, (1 << 63) - 1, 1 << 63, 0xFFFFFFFFFF600000, (1 << 64) - 1]


def test_u64_mapping_round_trips() -> None:
    for value in HIGH_VALUES:
        stored = u64_to_sql(value)
        assert -(1 << 63) <= stored < 1 << 63
        assert u64_from_sql(stored) == value


def test_addresses_at_and_above_2_63_are_stored_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "high.db"
    writer = ProfileWriter(path)
    module = writer.ids.module_id("[vsyscall]", None)
    writer.ids.add_mapping(module, 0xFFFFFFFFFF600000, 0xFFFFFFFFFF601000, 0)
    frames = [
        writer.ids.frame_id(
            address, module, address - 0xFFFFFFFFFF600000, [LocationKey(f"f{i}", "", 0, module)]
        )
        for i, address in enumerate([0xFFFFFFFFFF600400, (1 << 64) - 16, 1 << 63])
        if address >= 0xFFFFFFFFFF600000
    ] + [writer.ids.frame_id(1 << 63, None, None, [])]
    stack = writer.ids.stack_id(frames)
    writer.write_checkpoint(Checkpoint(timestamp_ms=1, samples=5, cpu={(stack, 7): 5}))
    writer.finish("test")

    with Profile(path) as profile:
        sample_set = load_samples(profile, "cpu")
    (sample,) = sample_set.samples
    assert [frame.address for frame in sample.frames] == [
        0xFFFFFFFFFF600400,
        (1 << 64) - 16,
        1 << 63,
    ]
    assert sample.frames[0].mapping is not None
    assert sample.frames[0].mapping.start == 0xFFFFFFFFFF600000

    # Appending re-reads the stored frames under their unsigned addresses.
    again = ProfileWriter(path, append=True)
    assert again.ids.has_frame(0xFFFFFFFFFF600400, module)
    again.close()


def test_gcc_clones_share_one_location(tmp_path: Path) -> None:
    """`work` and `work.constprop.0` (likewise .isra.0, .part.0, .cold) have the same
    function, file and line: one location, as the schema's UNIQUE rule says."""
    writer = ProfileWriter(tmp_path / "clones.db")
    module = writer.ids.module_id("/bin/app", "abcd")
    ids = {
        writer.ids.location_id(LocationKey("work", "app.c", 12, module, system))
        for system in (None, "work.constprop.0", "work.isra.0", "work.part.0", "work.cold")
    }
    assert len(ids) == 1
    frames = [
        writer.ids.frame_id(
            0x1000 + i,
            module,
            0x1000 + i,
            [LocationKey("work", "app.c", 12, module, f"work.clone.{i}")],
        )
        for i in range(4)
    ]
    writer.write_checkpoint(Checkpoint(timestamp_ms=1, cpu={(writer.ids.stack_id(frames), 1): 1}))
    writer.finish("test")


