"""A heap ring of this very process, written by hand as the shim would (docs/heap-ring.md):
for the reader's rules without a target (tests/unit/test_heap_lap.py,
test_heap_final_read.py, test_heap_records.py)."""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from rsprof._native import HEAP_RING_HEADER_SIZE, HEAP_RING_VERSION

MAGIC = 0x3150414548505352
RING = 1 << 16  # 64 KiB: jumps from offset 16 KiB on
JUMP_AT = RING // 4
FLAGS, WRITE_POS, READ_POS = 128, 192, 256  # header offsets (docs/heap-ring.md)
EXITED = 1
ALLOC, FREE, FREE_SHORT, AGAIN_SHORT = 1, 2, 4, 5  # record kinds (native/heapring.h)


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

    def free(self, address: int) -> None:
        self.commit_free(self.reserve_free(address))

    def frees(self, n: int) -> None:
        for k in range(n):
            self.commit_free(self.reserve_free(0x1000 + 16 * k))

    def record(self, *words: int) -> int:
        """A record written and committed as the shim does: reserved at the writers'
        cursor, its body, then its commit word (words[0]). Its position."""
        pos = self.header(WRITE_POS)
        for k, word in enumerate(words[1:], 1):
            struct.pack_into("<Q", self.map, HEAP_RING_HEADER_SIZE + (pos + 8 * k) % RING, word)
        struct.pack_into("<Q", self.map, WRITE_POS, pos + 8 * len(words))
        struct.pack_into("<Q", self.map, HEAP_RING_HEADER_SIZE + pos % RING, words[0])
        return pos

    def data_words(self, start: int, end: int) -> list[int]:
        """Data area words of byte offsets [start, end)."""
        return list(struct.unpack_from(f"<{(end - start) // 8}Q", self.map,
                                       HEAP_RING_HEADER_SIZE + start))

    def allocated(self) -> int:
        return self.path.stat().st_blocks * 512


def made_ring() -> Iterator[Ring]:
    """A Ring, unmapped and removed after the test; a test module makes it its fixture:
    `ring = pytest.fixture(name="ring")(made_ring)`."""
    made = Ring()
    try:
        yield made
    finally:
        made.map.close()
        made.path.unlink(missing_ok=True)


