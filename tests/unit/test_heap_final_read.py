"""The last read of a heap ring when a recording ends (collector/heap.py HeapTracker.settle,
collector/recorder.py _settle_heaps): a writer stopped between reserving a record and
committing it (preempted on a loaded machine) stops the reader at its record; everything
the program wrote before the stop is read all the same once it commits, and the wait is
bounded when it never does."""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from rsprof.collector.heap import HeapTracker

from rsprof._native import HEAP_RING_HEADER_SIZE, HEAP_RING_VERSION, HeapReader

MAGIC = 0x3150414548505352
RING = 1 << 16
WRITE_POS = 192  # the header's write_pos (docs/heap-ring.md)
FREE = 2


class Ring:
    """A ring of this very process, written by hand as the shim would."""

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
        self.write_pos = 0

    def reserve_free(self, address: int) -> int:
        """A FREE record reserved (write_pos moved, body written), not committed."""
        pos = self.write_pos
        self.write_pos += 16
        struct.pack_into("<Q", self.map, HEAP_RING_HEADER_SIZE + pos + 8, address)
        struct.pack_into("<Q", self.map, WRITE_POS, self.write_pos)
        return pos

    def commit_free(self, pos: int) -> None:
        struct.pack_into("<Q", self.map, HEAP_RING_HEADER_SIZE + pos, FREE | 4242 << 32)

    def free(self, address: int) -> None:
        self.commit_free(self.reserve_free(address))


@pytest.fixture
def ring() -> Iterator[Ring]:
    made = Ring()
    try:
        yield made
    finally:
        made.map.close()
        made.path.unlink(missing_ok=True)


def _tracker(ring: Ring) -> HeapTracker:
    reader = HeapReader.attach(os.getpid(), ring.path.name)
    return HeapTracker(reader, cast(Any, None))  # settle() resolves nothing


def test_records_behind_an_uncommitted_one_are_read_once_it_commits(ring: Ring) -> None:
    """Three frees before the stop, the second still being written (its thread preempted):
    the reader stops at it; settle() waits for its commit and reads all three."""
    tracker = _tracker(ring)
    try:
        ring.free(0x1000)
        pending = ring.reserve_free(0x2000)
        ring.free(0x3000)
        tracker.drain()
        assert tracker.reader.read_pos == 16  # stopped at the uncommitted record
        mark = tracker.reader.write_pos
        assert mark == 48
        committer = threading.Timer(0.05, ring.commit_free, (pending,))
        committer.start()
        started = time.monotonic()
        assert tracker.settle(mark, started + 5)
        waited = time.monotonic() - started
        committer.join()
        assert tracker.reader.read_pos == 48
        batch = tracker.reader.take()
        assert (batch.events, batch.unknown_frees) == (3, 3)
        assert 0.04 < waited < 2, waited
    finally:
        tracker.close()


def test_a_record_never_committed_ends_the_wait_at_the_deadline(ring: Ring) -> None:
    tracker = _tracker(ring)
    try:
        ring.free(0x1000)
        ring.reserve_free(0x2000)
        ring.free(0x3000)
        started = time.monotonic()
        assert not tracker.settle(tracker.reader.write_pos, started + 0.2)
        assert 0.2 <= time.monotonic() - started < 2
        assert tracker.reader.take().events == 1
    finally:
        tracker.close()


def test_nothing_pending_returns_at_once(ring: Ring) -> None:
    tracker = _tracker(ring)
    try:
        for address in range(0x1000, 0x1000 + 100 * 16, 16):
            ring.free(address)
        started = time.monotonic()
        assert tracker.settle(tracker.reader.write_pos, started + 5)
        assert time.monotonic() - started < 0.5
        assert tracker.reader.take().events == 100
        assert tracker.settle(0, time.monotonic())  # a mark below what was read
    finally:
        tracker.close()
