"""The last read of a heap ring when a recording ends (collector/heap.py HeapTracker.settle,
collector/recorder.py _settle_heaps): a writer stopped between reserving a record and
committing it (preempted on a loaded machine) stops the reader at its record; everything
the program wrote before the stop is read all the same once it commits, and the wait is
bounded when it never does."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, cast

import pytest
from rsprof.collector.heap import HeapTracker

from rsprof._native import HeapReader
from unit.handring import Ring, made_ring

ring = pytest.fixture(name="ring")(made_ring)


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
