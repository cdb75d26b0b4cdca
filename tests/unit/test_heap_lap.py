"""Lap jumps (native/heapreader.c lap_jump, docs/heap-ring.md "Protocol"): a reader that has
read everything the writers reserved, at a quarter of the ring (at most 128 KiB) or past it,
moves write_pos and read_pos to the next lap's start, so that the writers reuse the ring's
first pages instead of allocating all of it. On a ring of this process written by hand as
the shim would: when it jumps, when it must not (a record reserved but not committed, too
early in the lap, a ring marked exited), that records after the jump are read, and that the
reader never touches the part of the ring it jumped over."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import pytest

from rsprof._native import HEAP_RING_HEADER_SIZE, HeapReader
from unit.handring import EXITED, FLAGS, JUMP_AT, READ_POS, RING, WRITE_POS, Ring, made_ring

ring = pytest.fixture(name="ring")(made_ring)


@pytest.fixture
def reader(ring: Ring) -> Iterator[HeapReader]:
    attached = HeapReader.attach(os.getpid(), ring.path.name)
    try:
        yield attached
    finally:
        attached.close()


def test_a_reader_that_read_everything_past_a_quarter_jumps_to_the_next_lap(
        ring: Ring, reader: HeapReader) -> None:
    """Both cursors move to the next lap's start; what was read is zeroed; the next records,
    written at data offset 0, are read."""
    n = JUMP_AT // 16 + 10
    ring.frees(n)
    assert reader.poll() == n
    assert reader.lap_jumps == 1
    assert ring.header(WRITE_POS) == ring.header(READ_POS) == RING
    assert reader.read_pos == reader.write_pos == RING
    assert set(ring.data_words(0, n * 16)) == {0}
    ring.frees(5)  # positions RING.. : data offsets 0..80
    assert reader.poll() == 5
    assert reader.read_pos == RING + 80 and reader.lap_jumps == 1  # 80 B: too early to jump
    batch = reader.take()
    assert (batch.events, batch.unknown_frees, batch.lost) == (n + 5, n + 5, 0)


def test_no_jump_before_a_quarter_of_the_ring(ring: Ring, reader: HeapReader) -> None:
    n = JUMP_AT // 16 - 1
    ring.frees(n)
    assert reader.poll() == n
    assert reader.lap_jumps == 0
    assert ring.header(WRITE_POS) == ring.header(READ_POS) == n * 16


def test_no_jump_over_a_record_reserved_but_not_committed(ring: Ring,
                                                          reader: HeapReader) -> None:
    """write_pos is past the reader: a writer is between its reservation and its commit, and
    the record must be read where it was reserved. Once committed, the next poll jumps."""
    n = JUMP_AT // 16 + 10
    ring.frees(n)
    pending = ring.reserve_free(0x9000)
    assert reader.poll() == n
    assert reader.lap_jumps == 0
    assert ring.header(READ_POS) == n * 16 and ring.header(WRITE_POS) == (n + 1) * 16
    ring.commit_free(pending)
    assert reader.poll() == 1
    assert reader.lap_jumps == 1
    assert ring.header(WRITE_POS) == ring.header(READ_POS) == RING
    assert reader.take().events == n + 1


def test_no_jump_in_a_ring_marked_exited(ring: Ring, reader: HeapReader) -> None:
    """Its writer is gone: nothing to make room for, and the header is left as it was."""
    ring.frees(JUMP_AT // 16 + 10)
    struct.pack_into("<I", ring.map, FLAGS, EXITED)
    reader.poll()
    assert reader.lap_jumps == 0
    assert ring.header(WRITE_POS) == ring.header(READ_POS) == (JUMP_AT // 16 + 10) * 16


def test_the_part_jumped_over_is_never_touched(ring: Ring, reader: HeapReader) -> None:
    """The tail of the lap jumped over gets no tmpfs page from the reader (neither read nor
    zeroed: it may hold the next lap's records already): the file's allocated pages stay
    those the writer wrote. A word planted there stays as it was."""
    n = JUMP_AT // 16 + 10
    ring.frees(n)
    tail = RING - 4096  # the last page of the data area
    assert ring.allocated() <= HEAP_RING_HEADER_SIZE + n * 16 + 4096
    before = ring.allocated()
    assert reader.poll() == n and reader.lap_jumps == 1
    assert ring.allocated() == before
    struct.pack_into("<Q", ring.map, HEAP_RING_HEADER_SIZE + tail, 0x5A5A)
    ring.frees(3)
    assert reader.poll() == 3
    assert ring.data_words(tail, tail + 8) == [0x5A5A]
