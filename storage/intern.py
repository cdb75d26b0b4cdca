"""The profile's ids for modules, mappings, locations, frames and stacks, given out in
memory as the symbolizer meets them, one id per distinct value (the schema's UNIQUE rules).

Symbolizing touches no SQLite: the rows new since the last checkpoint wait in an
`InternedRows` batch, which the writer stores with the checkpoint (one statement per
table, in the checkpoint's transaction, so a reader never sees a stack whose frames are not
stored yet). Ids continue those already in the file when a recording is appended to one.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field

from rsprof.storage.schema import u64_from_sql, u64_to_sql

_JSON: list[bool] = []  # whether this process's SQLite has json_each (asked once)


def has_json(conn: sqlite3.Connection) -> bool:
    if not _JSON:
        try:
            conn.execute("SELECT json_array_length('[]')").fetchone()
            _JSON.append(True)
        except sqlite3.OperationalError:
            _JSON.append(False)
    return _JSON[0]


@dataclass(frozen=True, slots=True)
class LocationKey:
    function: str
    file: str
    line: int
    module_id: int | None
    system_name: str | None = None


@dataclass(slots=True)
class InternedRows:
    """Rows interned since the last checkpoint, in the columns of their tables."""

    modules: list[tuple[int, str, str | None]] = field(default_factory=list)
    mappings: list[tuple[int, int, int, int]] = field(default_factory=list)
    locations: list[tuple[int, str, str, int, int | None, str | None]] = field(
        default_factory=list)
    frames: list[tuple[int, int, int | None, int | None]] = field(default_factory=list)
    frame_locations: list[tuple[int, int, int]] = field(default_factory=list)
    # stack id -> its frame ids, leaf first: the `stacks` row and its `stack_frames` rows
    stacks: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.modules or self.mappings or self.locations or self.frames
                    or self.stacks)

    def store(self, conn: sqlite3.Connection) -> None:
        """Inserts the rows (the caller owns the transaction and its errors)."""
        conn.executemany("INSERT INTO modules (id, path, build_id) VALUES (?, ?, ?)",
                         self.modules)
        conn.executemany('INSERT INTO mappings (module_id, start, "end", file_offset)'
                         " VALUES (?, ?, ?, ?)", self.mappings)
        conn.executemany("INSERT INTO locations (id, function, file, line, module_id,"
                         " system_name) VALUES (?, ?, ?, ?, ?, ?)", self.locations)
        conn.executemany("INSERT INTO frames (id, address, module_id, module_offset)"
                         " VALUES (?, ?, ?, ?)", self.frames)
        conn.executemany("INSERT INTO frame_locations (frame_id, inline_depth, location_id)"
                         " VALUES (?, ?, ?)", self.frame_locations)
        if self.stacks:
            # One JSON document, {stack id: [frame ids, leaf first]}, expanded by SQLite:
            # a new stack is ~40 frames, and a row each through executemany was 0.8 µs of
            # Python per frame, ~40 µs per stack, most of storing a checkpoint with
            # off-CPU stacks (nearly every preempted switch-out is a new stack). The
            # position is the array index (leaf 0), as the rows were written before.
            if has_json(conn):
                document = json.dumps(self.stacks, separators=(",", ":"))
                conn.execute("INSERT INTO stacks (id, depth) SELECT CAST(key AS INTEGER),"
                             " json_array_length(value) FROM json_each(?)", (document,))
                conn.execute("INSERT INTO stack_frames (stack_id, position, frame_id)"
                             " SELECT CAST(s.key AS INTEGER), f.key, f.value"
                             " FROM json_each(?) AS s, json_each(s.value) AS f", (document,))
            else:  # an SQLite built without its JSON functions (before 3.38 they were optional)
                conn.executemany("INSERT INTO stacks (id, depth) VALUES (?, ?)",
                                 [(sid, len(frames)) for sid, frames in self.stacks.items()])
                conn.executemany("INSERT INTO stack_frames (stack_id, position, frame_id)"
                                 " VALUES (?, ?, ?)",
                                 [(sid, position, frame) for sid, frames in self.stacks.items()
                                  for position, frame in enumerate(frames)])


class InternTable:
    """One id per module, location, frame and stack of the profile."""

    def __init__(self) -> None:
        self._modules: dict[tuple[str, str | None], int] = {}
        self._locations: dict[tuple[str, str, int, int | None], int] = {}
        # (address, module, location ids innermost first) -> frame id: one address is two
        # frames when it is both a leaf (looked up at the address) and a return address
        # (looked up at the call, address - 1) and the two lookups name different lines.
        self._frames: dict[tuple[int, int | None, tuple[int, ...]], int] = {}
        self._frame_addresses: set[tuple[int, int | None]] = set()
        self._stacks: dict[tuple[int, ...], int] = {}
        self.stack_frames: dict[int, tuple[int, ...]] = {}  # stack id -> frame ids, leaf first
        # frame id -> its innermost location; stack id -> its leaf's (self time per line)
        self.frame_leaf_location: dict[int, int] = {}
        self.stack_leaf_location: dict[int, int] = {}
        self._last = {"modules": 0, "locations": 0, "frames": 0, "stacks": 0}
        self._pending = InternedRows()

    @classmethod
    def load(cls, conn: sqlite3.Connection) -> InternTable:
        """The ids a profile holds already (appending to it)."""
        table = cls()
        for mid, path, build_id in conn.execute("SELECT id, path, build_id FROM modules"):
            table._modules[(path, build_id)] = mid
        for lid, function, file, line, module_id in conn.execute(
            "SELECT id, function, file, line, module_id FROM locations"
        ):
            table._locations[(function, file, line, module_id)] = lid
        chains: dict[int, list[int]] = {}
        for frame_id, location_id in conn.execute(
            "SELECT frame_id, location_id FROM frame_locations ORDER BY frame_id, inline_depth"
        ):
            chains.setdefault(frame_id, []).append(location_id)
        for fid, address, module_id in conn.execute("SELECT id, address, module_id FROM frames"):
            place = (u64_from_sql(address), module_id)
            chain = tuple(chains.get(fid, ()))
            table._frames[(*place, chain)] = fid
            table._frame_addresses.add(place)
            if chain:
                table.frame_leaf_location[fid] = chain[0]
        stack_frames: dict[int, list[int]] = {}
        for stack_id, frame_id in conn.execute(
            "SELECT stack_id, frame_id FROM stack_frames ORDER BY stack_id, position"
        ):
            stack_frames.setdefault(stack_id, []).append(frame_id)
        for stack_id, frames in stack_frames.items():
            table._stacks[tuple(frames)] = stack_id
            table.stack_frames[stack_id] = tuple(frames)
            if frames and frames[0] in table.frame_leaf_location:
                table.stack_leaf_location[stack_id] = table.frame_leaf_location[frames[0]]
        for name in table._last:
            table._last[name] = conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {name}"
                                             ).fetchone()[0]
        return table

    def _next(self, table: str) -> int:
        self._last[table] += 1
        return self._last[table]

    def take(self) -> InternedRows:
        """The rows interned since the last take, for the writer to store."""
        rows, self._pending = self._pending, InternedRows()
        return rows

    def module_id(self, path: str, build_id: str | None) -> int:
        key = (path, build_id)
        found = self._modules.get(key)
        if found is None:
            found = self._modules[key] = self._next("modules")
            self._pending.modules.append((found, path, build_id))
        return found

    def add_mapping(self, module_id: int, start: int, end: int, file_offset: int) -> None:
        self._pending.mappings.append(
            (module_id, u64_to_sql(start), u64_to_sql(end), u64_to_sql(file_offset)))

    def location_id(self, key: LocationKey) -> int:
        """One row per (function, file, line, module): the schema's UNIQUE rule, so GCC
        clones (`work` and `work.constprop.0` share their source lines) are one location;
        the first linker name seen is kept as system_name."""
        unique = (key.function, key.file, key.line, key.module_id)
        found = self._locations.get(unique)
        if found is None:
            found = self._locations[unique] = self._next("locations")
            self._pending.locations.append(
                (found, key.function, key.file, key.line, key.module_id, key.system_name))
        return found

    def frame_id(
        self,
        address: int,
        module_id: int | None,
        module_offset: int | None,
        locations: Sequence[LocationKey],
    ) -> int:
        """The frame for one address and what it was resolved to: `locations` is its inline
        chain, innermost first. The same address with another chain is another frame (a
        leaf at the address, a caller at its call instruction)."""
        location_ids = tuple(self.location_id(location) for location in locations)
        key = (address, module_id, location_ids)
        found = self._frames.get(key)
        if found is not None:
            return found
        found = self._frames[key] = self._next("frames")
        self._frame_addresses.add((address, module_id))
        self._pending.frames.append((
            found, u64_to_sql(address), module_id,
            None if module_offset is None else u64_to_sql(module_offset)))
        self._pending.frame_locations.extend(
            (found, depth, lid) for depth, lid in enumerate(location_ids))
        if location_ids:
            self.frame_leaf_location[found] = location_ids[0]
        return found

    def has_frame(self, address: int, module_id: int | None) -> bool:
        return (address, module_id) in self._frame_addresses

    def stack_id(self, frame_ids: Sequence[int]) -> int:
        """The stack for frames listed leaf first."""
        key = tuple(frame_ids)
        found = self._stacks.get(key)
        if found is not None:
            return found
        found = self._stacks[key] = self._next("stacks")
        self.stack_frames[found] = key
        self._pending.stacks[found] = key
        if key and key[0] in self.frame_leaf_location:
            self.stack_leaf_location[found] = self.frame_leaf_location[key[0]]
        return found
