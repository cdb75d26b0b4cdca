"""On-disk cache of symbolized addresses, one SQLite file per build id and file.

Layout: <cache_dir>/symbols/<build_id>-<identity>.db (identity: symbolizer.cache_identity,
so two files claiming one build id never share entries) with
    meta(key TEXT PRIMARY KEY, value TEXT)    -- 'format', 'source' (where DWARF came from)
    frames(vaddr INTEGER PRIMARY KEY, frames TEXT)  -- JSON [[function, file, line, system], ...]
Only JSON is stored (nothing is unpickled or executed). WAL mode and a busy timeout let several
profiler processes read and add entries at once; a file that SQLite cannot read, or whose format
does not match, is deleted and rebuilt rather than trusted.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path

from .model import SourceFrame

FORMAT = "3"  # 2: stripped code named by its FDE start, not per address; 3: PLT stubs
# named `name@plt`, C++ inlined frames qualified (std::sort<...>), lambdas apart
_CHUNK = 500  # addresses per SELECT: well under SQLite's bound-variable limit
_MAX_KEY = (1 << 63) - 1  # SQLite integers are signed 64-bit


def encode(frames: tuple[SourceFrame, ...]) -> str:
    return json.dumps([[f.function, f.file, f.line, f.system_name] for f in frames],
                      separators=(",", ":"))


def decode(text: str) -> tuple[SourceFrame, ...] | None:
    """Frames from their JSON form, or None if the text is not what `encode` writes."""
    try:
        raw = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(raw, list) or not raw:
        return None
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 4):
            return None
        function, file, line, system_name = item
        if not (isinstance(function, str) and isinstance(file, str) and isinstance(line, int)
                and (system_name is None or isinstance(system_name, str))):
            return None
        out.append(SourceFrame(function, file, line, system_name))
    return tuple(out)


class FrameCache:
    """Frames per vaddr of one build id. Every failure degrades to a cache miss."""

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self._source = source
        self._conn: sqlite3.Connection | None = None
        self._disabled = False

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is not None or self._disabled:
            return self._conn
        for attempt in range(2):
            try:
                self._conn = self._open()
                return self._conn
            except sqlite3.DatabaseError:
                # Corrupt or foreign file: start over once, then give up on the disk cache.
                self.close()
                if attempt == 0:
                    self._remove_files()
            except OSError:
                break
        self._disabled = True
        return None

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(self.path), timeout=10.0, isolation_level=None,
                               check_same_thread=False)
        try:
            with contextlib.suppress(sqlite3.OperationalError):  # busy: keep the current mode
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)")
            conn.execute("CREATE TABLE IF NOT EXISTS frames"
                         "(vaddr INTEGER PRIMARY KEY, frames TEXT NOT NULL)")
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if meta.get("format") != FORMAT or meta.get("source") != self._source:
                # Written by another format, or before a debug file appeared: start fresh.
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("DELETE FROM frames")
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('format', ?)", (FORMAT,))
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('source', ?)", (self._source,))
                conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        return conn

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.unlink(f"{self.path}{suffix}")

    def _fail(self) -> None:
        """A query failed on an open connection (corruption found late): rebuild next time."""
        self.close()
        self._remove_files()

    def get_many(self, vaddrs: Iterable[int]) -> dict[int, tuple[SourceFrame, ...]]:
        conn = self._connect()
        keys = [a for a in vaddrs if 0 <= a <= _MAX_KEY]
        out: dict[int, tuple[SourceFrame, ...]] = {}
        if conn is None or not keys:
            return out
        try:
            for i in range(0, len(keys), _CHUNK):
                chunk = keys[i:i + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT vaddr, frames FROM frames WHERE vaddr IN ({marks})", chunk)
                for vaddr, text in rows:
                    frames = decode(text) if isinstance(text, str) else None
                    if frames is not None:
                        out[vaddr] = frames
        except sqlite3.DatabaseError:
            self._fail()
        return out

    def put_many(self, items: Mapping[int, tuple[SourceFrame, ...]]) -> None:
        conn = self._connect()
        rows = [(a, encode(f)) for a, f in items.items() if 0 <= a <= _MAX_KEY]
        if conn is None or not rows:
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT OR REPLACE INTO frames VALUES (?, ?)", rows)
            conn.execute("COMMIT")
        except sqlite3.OperationalError:
            # Locked past the timeout, disk full, read-only: the results stay in memory only.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        except sqlite3.DatabaseError:
            self._fail()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
