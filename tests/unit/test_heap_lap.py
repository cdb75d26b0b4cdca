"""Lap jumps (native/heapreader.c lap_jump, docs/heap-ring.md "Protocol"): a reader that has
read everything the writers reserved, at a quarter of the ring (at most 128 KiB) or past it,
moves write_pos and read_pos to the next lap's start, so that the writers reuse the ring's
first pages instead of allocating all of it. On a ring of this process written by hand as
the shim would: when it jumps, when it must not (a record reserved but not committed, too
early in the lap, a ring marked exited), that records after the jump are read, and that the
reader never touches the part of the ring it jumped over."""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from rsprof._native import HEAP_RING_HEADER_SIZE, HEAP_RING_VERSION, HeapReader

MAGIC = 0x3150414548505352
RING = 1 << 16  # 64 KiB: jumps from offset 16 KiB on
JUMP_AT = RING // 4
FLAGS, WRITE_POS, READ_POS = 128, 192, 256  # header offsets (docs/heap-ring.md)
EXITED = 1
FREE = 2


class Ring:
    """A sparse ring file of this very process: tmpfs pages only where written."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.path = Path(f"/dev/shm/rsprof-heap.{pid}.{os.urandom(8).hex()}")
        stat = Path("/proc/self/stat").read_text()
        start = int(stat[stat.rindex(")") + 2:].split()[19])
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, HEAP_RING_HEADER_SIZE + RING)
            self.map = mmap.mmap(fd, HEAP_RING_HEADER_SIZE + RING)
        finally:
            os.close(fd)
        struct.pack_into("<QIIQiIQQQI", self.map, 0, MAGIC, HEAP_RING_VERSION,
                         HEAP_RING_HEADER_SIZE, RING, pid, os.geteuid(), start, 0, 0, 64)

    def header(self, offset: int) -> int:
        return int(struct.unpack_from("<Q", self.map, offset)[0])

    def reserve_free(self, address: int) -> int:
        """A FREE record reserved at the writers' cursor (body written), not committed."""
        pos = self.header(WRITE_POS)
        struct.pack_into("<Q", self.map, HEAP_RING_HEADER_SIZE + (pos + 8) % RING, address)
        struct.pack_into("<Q", self.map, WRITE_POS, pos + 16)
        return pos

    def commit_free(self, pos: int) -> None:
        struct.pack_into("<Q", self.map, HEAP_RING_HEADER_SIZE + pos % RING, FREE | 4242 << 32)

    def frees(self, n: int) -> None:
        for k in range(n):
            self.commit_free(self.reserve_free(0x1000 + 16 * k))

    def data_words(self, start: int, end: int) -> list[int]:
        """Data area words of byte offsets [start, end)."""
        return list(struct.unpack_from(f"<{(end - start) // 8}Q", self.map,
                                       HEAP_RING_HEADER_SIZE + start))

    def allocated(self) -> int:
        return self.path.stat().st_blocks * 512


@pytest.fixture
def ring() -> Iterator[Ring]:
    made = Ring()
    try:
        yield made
    finally:
        made.map.close()
        made.path.unlink(missing_ok=True)


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
