"""The heap ring's records as the reader takes them (native/heapreader.c, the format in
native/heapring.h and docs/heap-ring.md "Records"), written by hand: the short forms of a
free and of a repeated stack (FREE_SHORT, AGAIN_SHORT) count exactly as the long ones."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from rsprof._native import HeapBatch, HeapReader
from unit.handring import AGAIN_SHORT, ALLOC, FREE, FREE_SHORT, Ring, made_ring

ring = pytest.fixture(name="ring")(made_ring)

TID = 4242
STACK = [0x401000, 0x402000, 0x403000]  # return addresses, leaf first


def alloc_naming_way(ring: Ring, address: int, size: int, way: int) -> None:
    """An ALLOC with its stack, naming memo way `way` of thread TID."""
    head = ALLOC | len(STACK) << 8 | (way + 1) << 24 | TID << 32
    ring.record(head, address, size, *STACK)


def again_short(ring: Ring, address: int, size: int, way: int) -> None:
    ring.record(AGAIN_SHORT | size << 8 | (way + 1) << 24 | TID << 32, address)


def again_long(ring: Ring, address: int, size: int, way: int) -> None:
    ring.record(3 | (way + 1) << 24 | TID << 32, address, size)


def free_short(ring: Ring, address: int) -> None:
    ring.record(FREE_SHORT | address << 8)


def free_long(ring: Ring, address: int) -> None:
    ring.record(FREE | TID << 32, address)


def read(ring: Ring) -> tuple[HeapReader, HeapBatch]:
    reader = HeapReader.attach(os.getpid(), ring.path.name)
    while reader.poll():
        pass
    return reader, reader.take()


@pytest.mark.parametrize(("again", "free"), [(again_short, free_short),
                                             (again_long, free_long),
                                             (again_short, free_long),
                                             (again_long, free_short)])
def test_short_and_long_records_count_the_same(ring: Ring, again: Callable[..., None],
                                              free: Callable[[Ring, int], None]) -> None:
    """One stack named once, then repeated 99 times and every block freed: 100 allocations
    and 100 frees of that stack, in either form."""
    alloc_naming_way(ring, 0x10000, 100, way=7)
    free(ring, 0x10000)
    for k in range(1, 100):
        again(ring, 0x10000 + 64 * k, 100 + k, way=7)
        free(ring, 0x10000 + 64 * k)
    reader, batch = read(ring)
    try:
        assert reader.read_pos == reader.write_pos
        assert reader.repeated == 99
        assert (batch.events, batch.unknown_frees, batch.dropped) == (200, 0, 0)
        assert len(batch.sites) == 1
        _, alloc_bytes, alloc_count, free_bytes, free_count = batch.sites[0]
        total = sum(100 + k for k in range(100))
        assert (alloc_bytes, alloc_count, free_bytes, free_count) == (total, 100, total, 100)
    finally:
        reader.close()


def test_largest_short_size_and_address(ring: Ring) -> None:
    """A size of 65,535 bytes (16 bits) and an address just below 2^56 survive the packing."""
    address = (1 << 56) - 64
    alloc_naming_way(ring, 0x10000, 8, way=0)
    again_short(ring, address, 0xFFFF, way=0)
    free_short(ring, address)
    reader, batch = read(ring)
    try:
        _, alloc_bytes, alloc_count, free_bytes, free_count = batch.sites[0]
        assert (alloc_bytes, alloc_count, free_bytes, free_count) == (8 + 0xFFFF, 2, 0xFFFF, 1)
    finally:
        reader.close()


def test_short_repeat_of_an_unknown_way_is_dropped_not_charged(ring: Ring) -> None:
    """An AGAIN_SHORT naming a way this reader never saw named (its naming record went to
    a reader before it) is dropped and counted, as the long form is."""
    again_short(ring, 0x10000, 32, way=3)
    free_short(ring, 0x10000)
    reader, batch = read(ring)
    try:
        assert batch.sites == [] and (batch.dropped, batch.unknown_frees) == (1, 1)
        assert reader.read_pos == reader.write_pos
    finally:
        reader.close()
