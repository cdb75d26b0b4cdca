"""The target's executable mappings: /proc/PID/maps at attach, MMAP2 records afterwards."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    file_offset: int
    path: str
    build_id: str | None = None


def read_executable_maps(pid: int) -> list[Mapping]:
    """Executable file-backed (and pseudo, like [vdso]) mappings of a process."""
    mappings = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5 or "x" not in parts[1]:
            continue
        start_text, end_text = parts[0].split("-")
        path = parts[5].strip() if len(parts) == 6 else "[anon]"
        if path == "[vsyscall]":
            continue  # a fixed kernel page above 2**63: never user code, and not storable
        mappings.append(
            Mapping(int(start_text, 16), int(end_text, 16), int(parts[2], 16), path)
        )
    return mappings


class AddressSpace:
    """Address → mapping lookup by binary search; later mappings replace what they overlap."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._mappings: list[Mapping] = []

    def add(self, mapping: Mapping) -> None:
        kept = [
            m for m in self._mappings if m.end <= mapping.start or m.start >= mapping.end
        ]
        kept.append(mapping)
        kept.sort(key=lambda m: m.start)
        self._mappings = kept
        self._starts = [m.start for m in kept]

    def copy(self) -> AddressSpace:
        other = AddressSpace()
        other._starts = list(self._starts)
        other._mappings = list(self._mappings)
        return other

    def find(self, address: int) -> Mapping | None:
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0:
            mapping = self._mappings[index]
            if mapping.start <= address < mapping.end:
                return mapping
        return None

    def __len__(self) -> int:
        return len(self._mappings)
