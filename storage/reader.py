"""Read-only access to a profile file: opening, metadata and the raw rows analyses build on."""

from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

from rsprof.storage.errors import ProfileError
from rsprof.storage.schema import READABLE_SCHEMA_VERSIONS


def connect_readonly(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Opens a profile read-only: writes through this connection fail, the file is untouched."""
    file = Path(path)
    try:
        st = file.stat()
    except FileNotFoundError:
        raise ProfileError(f"{file}: no such file") from None
    except OSError as error:  # a name too long, a loop of links, a component not a folder
        raise ProfileError(f"{file}: {error.strerror or error}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ProfileError(f"{file}: not a file")
    try:
        conn, row = _open_untouched(file.resolve())
    except sqlite3.DatabaseError as error:
        raise ProfileError(f"{file}: not an rsprof profile ({error})") from error
    if row is None:
        conn.close()
        raise ProfileError(f"{file}: not an rsprof profile (no schema_version in meta)")
    if row[0] not in READABLE_SCHEMA_VERSIONS:
        conn.close()
        raise ProfileError(
            f"{file}: profile schema {row[0]} is not supported (this rsprof reads schemas"
            f" {', '.join(READABLE_SCHEMA_VERSIONS)})"
        )
    return conn


def _open_untouched(file: Path) -> tuple[sqlite3.Connection, tuple[object, ...] | None]:
    """A read-only connection that modifies no file, and the profile's schema version.

    mode=ro alone still writes a WAL-mode file's -shm index (read marks, the header it
    rebuilds): readonly_shm=1 maps it read-only instead, and reads a live recording's or a
    killed one's WAL all the same. A file in rollback mode (a finished profile) is read
    by mode=ro without a write. A WAL-mode file without its -shm (readonly_shm would fail
    there, after creating an empty -wal) is opened immutable=1, which ignores the WAL, so
    only when the WAL holds nothing; a WAL with content and no index (someone deleted it)
    is read by plain mode=ro, which recreates the -shm beside it, the only case that
    writes anything, and never the profile or its WAL."""
    uri = f"{file.as_uri()}?mode=ro"
    if os.path.exists(f"{file}-shm"):
        return _open_checked(f"{uri}&readonly_shm=1")
    wal_mode = False
    try:
        with open(file, "rb") as header:
            wal_mode = header.read(20)[18:20] == b"\x02\x02"  # file format versions
        wal_size = os.stat(f"{file}-wal").st_size
    except OSError:
        wal_size = 0
    if wal_mode and wal_size == 0:
        return _open_checked(f"{uri}&immutable=1")
    return _open_checked(uri)


def _open_checked(uri: str) -> tuple[sqlite3.Connection, tuple[object, ...] | None]:
    conn = sqlite3.connect(uri, uri=True)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn, row


@dataclass(frozen=True, slots=True)
class ProfileSummary:
    path: Path
    pid: int | None
    process: str
    start_time_ms: int | None
    duration_ms: int
    samples: int
    lost_samples: int
    state: str


class Profile:
    """One profile file opened read-only."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.conn = connect_readonly(self.path)

    def __enter__(self) -> Profile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def rows(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple]:  # type: ignore[type-arg]
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as error:
            raise ProfileError(f"{self.path}: {error}") from error

    def has(self, name: str) -> bool:
        """The file has a table or view of this name."""
        return bool(self.rows("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)))

    def meta(self) -> dict[str, str]:
        return {key: value for key, value in self.rows("SELECT key, value FROM meta")}

    def summary(self) -> ProfileSummary:
        meta = self.meta()
        samples, lost, _first_ms, last_ms = self.rows(
            "SELECT COALESCE(SUM(samples), 0), COALESCE(SUM(lost_samples), 0),"
            " MIN(timestamp_ms), MAX(timestamp_ms) FROM checkpoints"
        )[0]
        start = _int_or_none(meta.get("start_time_ms"))
        end = _int_or_none(meta.get("end_time_ms")) or last_ms
        duration = max(0, end - start) if start is not None and end is not None else 0
        return ProfileSummary(
            path=self.path,
            pid=_int_or_none(meta.get("pid")),
            process=meta.get("process_name", "?"),
            start_time_ms=start,
            duration_ms=duration,
            samples=samples,
            lost_samples=lost,
            state=_state(self.path, meta.get("state", "?")),
        )


def _state(path: Path, stored: str) -> str:
    """"recording" only while a recorder holds the file's lock (storage/writer.py takes an
    exclusive flock for its lifetime): a recorder killed with SIGKILL leaves "recording" in
    meta, and its file is "abandoned" (readable: every checkpoint it wrote is there)."""
    if stored != "recording":
        return stored
    held = flock_held(path)
    return "abandoned" if held is False else stored


def flock_held(path: Path) -> bool | None:
    """Whether some process holds a flock on the file, from /proc/locks (read, not taken: a
    lock taken to test would make a recorder starting at that moment fail); None when it
    cannot be told (no /proc/locks, the file gone)."""
    try:
        st = path.stat()
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF" (device major:minor in hex, inode)
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == want:
            return True
    return False



def _int_or_none(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload,no-any-return]
    except (TypeError, ValueError):
        return None
